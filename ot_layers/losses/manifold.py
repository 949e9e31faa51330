"""The (manifold) proxy N-pair loss of EDMS (Aziere and Todorovic 2019, eq. 4, 11, 12)."""
import keras
import tensorflow as tf

from ot_layers.validation import check_non_negative


@keras.saving.register_keras_serializable(package="ot_layers")
class ManifoldProxyLoss(keras.losses.Loss):
    """``L = log(1 + sum_{j != k} exp(s_j - s_k + m))`` for a sample of meta-class ``k`` with proxy similarities
    ``s`` ``(B, K)`` from ``layers.ManifoldProxies``: ``L_cxt`` (eq. 12) for ``mode="contextual"``, ``L_int``
    (eq. 11) for ``"intrinsic"``, ``L_P*`` (eq. 4) for ``"direct"``. Margin ``m = 5e-4`` (Aziere and Todorovic 2019,
    Sec. 9)."""

    def __init__(self, margin=5e-4, name="manifold_proxy", reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.margin = float(check_non_negative("margin", margin))

    def call(self, y_true, y_pred):
        s = tf.cast(y_pred, tf.float32)
        labels = tf.reshape(tf.cast(y_true, tf.int32), [-1])
        positive = tf.gather(s, labels, axis=1, batch_dims=1)
        others = tf.one_hot(labels, tf.shape(s)[1], on_value=False, off_value=True)
        exponents = tf.where(others, s - positive[:, None] + self.margin, tf.fill(tf.shape(s), -float("inf")))
        return tf.math.softplus(tf.reduce_logsumexp(exponents, axis=1))

    def get_config(self):
        config = super().get_config()
        config.update(margin=self.margin)
        return config
