"""ManifoldProxies: similarities of a mini-batch to K meta-class proxies, direct or through the random walk (EDMS,
paper 002, SPEC S7)."""
import keras
import tensorflow as tf

from ot_layers.solvers.random_walk import random_walk_similarity
from ot_layers.validation import check_choice, check_in_range, check_positive, check_positive_int, check_rank

MODES = ("contextual", "intrinsic", "direct")


@keras.saving.register_keras_serializable(package="ot_layers")
class ManifoldProxies(keras.layers.Layer):
    """Similarities ``(B, K)`` of normalized embeddings ``x_n`` ``(B, dim)`` to the ``K`` proxies ``p_k``.

    The proxies (``proxies`` ``(K, dim)``, non-trainable) are set between epochs by
    ``callbacks.HardProxyUpdate``. With ``F`` the random-walk similarity (``solvers.random_walk_similarity``,
    eq. 9) of the ``B + K`` points ``{x_1..x_B, p_1..p_K}`` (eq. 8), ``f_n = F[n, proxies]`` and
    ``f_{p_k} = F[p_k, proxies]`` (eq. 10), the output is

    - ``mode="contextual"``: ``f_n . f_{p_j}`` (the similarities of eq. 12, loss ``L_cxt``);
    - ``mode="intrinsic"``: ``f_{n p_j}`` (eq. 11, loss ``L_int``);
    - ``mode="direct"``: ``x_n . p_j`` (no random walk: the proxy N-pair loss ``L_P*`` of eq. 4).

    Feed the output to ``losses.ManifoldProxyLoss`` with the meta-class labels. A training-time head: the output
    of a sample depends on the rest of the batch, so export the embedding model instead (``export_blocker``).
    """

    def __init__(self, num_proxies, dim, mode="contextual", alpha=0.8, temperature=0.5, **kwargs):
        super().__init__(**kwargs)
        self.num_proxies = check_positive_int("num_proxies", num_proxies)
        self.dim = check_positive_int("dim", dim)
        self.mode = check_choice("mode", mode, MODES)
        self.alpha = float(check_in_range("alpha", alpha, 0.0, 1.0, low_open=True, high_open=True))
        self.temperature = float(check_positive("temperature", temperature))

    export_blocker = ("ManifoldProxies is a training head (its output depends on the whole batch and it inverts a "
                      "matrix, which ONNX lacks); export the embedding model instead.")

    def build(self, input_shape):
        check_rank("inputs", input_shape, (2,))
        if input_shape[-1] is not None and int(input_shape[-1]) != self.dim:
            raise ValueError(f"`dim` is {self.dim} but the inputs have feature dimension {input_shape[-1]}.")
        self.proxies = self.add_weight(name="proxies", shape=(self.num_proxies, self.dim),
                                       initializer=keras.initializers.RandomNormal(stddev=1.0 / self.dim ** 0.5),
                                       trainable=False, autocast=False)

    def call(self, inputs):
        x = tf.math.l2_normalize(tf.cast(inputs, tf.float32), axis=-1, epsilon=1e-12)
        proxies = tf.math.l2_normalize(tf.convert_to_tensor(self.proxies), axis=-1, epsilon=1e-12)
        if self.mode == "direct":
            return tf.cast(tf.matmul(x, proxies, transpose_b=True), self.compute_dtype)
        batch = tf.shape(x)[0]
        f = random_walk_similarity(tf.concat([x, proxies], axis=0), self.alpha, self.temperature)
        to_proxies = f[:, batch:]  # (B + K, K)
        f_samples, f_proxies = to_proxies[:batch], to_proxies[batch:]
        if self.mode == "intrinsic":
            out = f_samples
        else:
            out = tf.matmul(f_samples, f_proxies, transpose_b=True)
        return tf.cast(out, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_proxies)

    def get_config(self):
        config = super().get_config()
        config.update(num_proxies=self.num_proxies, dim=self.dim, mode=self.mode, alpha=self.alpha,
                      temperature=self.temperature)
        return config
