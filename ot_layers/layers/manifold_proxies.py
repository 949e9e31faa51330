"""ManifoldProxies: similarities of a mini-batch to K meta-class proxies, direct or through the random walk (EDMS,
Aziere and Todorovic 2019)."""
import keras
from keras import ops

from ot_layers.layers.base import ExportableLayer
from ot_layers.solvers.random_walk import random_walk_similarity_and_mask
from ot_layers.tensor_ops import normalize_rows
from ot_layers.validation import (check_choice, check_in_range, check_positive, check_positive_int, check_rank,
                                  check_same_dim)

MODES = ("contextual", "intrinsic", "direct")


@keras.saving.register_keras_serializable(package="ot_layers")
class ManifoldProxies(ExportableLayer):
    """Similarities ``(B, K)`` of normalized embeddings ``x_n`` ``(B, dim)`` to the proxies ``p_k`` of the
    ``K = num_classes`` meta-classes (one proxy per meta-class).

    The proxies (``proxies`` ``(K, dim)``, non-trainable) are set between epochs by
    ``callbacks.HardProxyUpdate``. ``temperature`` divides the cosines in the random walk's affinity
    ``exp(x_i . x_j / temperature)``; ``alpha`` is the walk's continue probability (eq. 9). With ``F`` the
    random-walk similarity (``solvers.random_walk_similarity``, eq. 9) of the ``B + K`` points
    ``{x_1..x_B, p_1..p_K}`` (eq. 8), ``f_n = F[n, proxies]`` and ``f_{p_k} = F[p_k, proxies]`` (eq. 10), the
    output is

    - ``mode="contextual"``: ``f_n . f_{p_j}`` (the similarities of eq. 12, loss ``L_cxt``);
    - ``mode="intrinsic"``: ``f_{n p_j}`` (eq. 11, loss ``L_int``);
    - ``mode="direct"``: ``x_n . p_j`` (no random walk: the proxy N-pair loss ``L_P*`` of eq. 4).

    Feed the output to ``losses.ManifoldProxyLoss`` with the meta-class labels. A training-time head: the output
    of a sample depends on the rest of the batch, so export the embedding model instead (``export_blocker``).

    Computes in float32 under any dtype policy (the output is cast to the compute dtype). Inputs are ``(B, dim)``
    vectors (pool feature maps before the layer). An all-zero embedding gives finite outputs and gradients; an
    embedding with a non-finite entry gives a NaN row for that sample only and is cut out of the random walk, so
    the other samples' outputs equal a run without it.
    """

    EXPORT_BLOCKER = ("ManifoldProxies is a training head (its output depends on the whole batch and it solves a "
                      "linear system, which ONNX lacks); export the embedding model instead.")

    def __init__(self, num_classes, dim, mode="contextual", alpha=0.8, temperature=0.5, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.dim = check_positive_int("dim", dim)
        self.mode = check_choice("mode", mode, MODES)
        self.alpha = float(check_in_range("alpha", alpha, 0.0, 1.0, low_open=True, high_open=True))
        self.temperature = float(check_positive("temperature", temperature))

    def build(self, input_shape):
        check_rank("inputs", input_shape, (2,))
        check_same_dim("inputs", input_shape[-1], "dim", self.dim)
        self.proxies = self.add_weight(name="proxies", shape=(self.num_classes, self.dim),
                                       initializer=keras.initializers.RandomNormal(stddev=1.0 / self.dim ** 0.5),
                                       trainable=False, autocast=False)
        self.input_spec = keras.layers.InputSpec(axes={-1: self.dim})  # another dim later: one error line

    def call(self, inputs):
        x = ops.cast(inputs, "float32")
        valid = ops.all(ops.isfinite(x), axis=-1)
        x = ops.where(valid[:, None], x, ops.zeros_like(x))  # a bad sample gets a NaN row and a zero gradient
        proxies = ops.cast(self.proxies, "float32")  # float64 under a float64 policy: torch will not mix the two
        if self.mode == "direct":
            out = ops.einsum("bd,kd->bk", normalize_rows(x), normalize_rows(proxies))
        else:
            # the walk normalizes the points; the bad samples' (zeroed) rows are cut out of the graph
            points = ops.concatenate([ops.where(valid[:, None], x, ops.full_like(x, float("nan"))), proxies], axis=0)
            f, _ = random_walk_similarity_and_mask(points, self.alpha, self.temperature)
            batch = ops.shape(x)[0]
            to_proxies = f[:, batch:]  # (B + K, K)
            f_samples, f_proxies = to_proxies[:batch], to_proxies[batch:]
            out = f_samples if self.mode == "intrinsic" else ops.einsum("bk,jk->bj", f_samples, f_proxies)
        out = ops.where(valid[:, None], out, ops.full_like(out, float("nan")))
        return ops.cast(out, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_classes)

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, dim=self.dim, mode=self.mode, alpha=self.alpha,
                      temperature=self.temperature)
        return config
