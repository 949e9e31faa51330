"""The (manifold) proxy N-pair loss of EDMS (Aziere and Todorovic 2019, eq. 4, 11, 12)."""
import keras
from keras import ops

from ot_layers.losses.common import KeepsDType, check_prediction_shape, class_labels, is_empty_batch, zero_loss
from ot_layers.tensor_ops import as_compute_dtype, label_columns
from ot_layers.validation import check_non_negative


@keras.saving.register_keras_serializable(package="ot_layers")
class ManifoldProxyLoss(KeepsDType, keras.losses.Loss):
    """``L = log(1 + sum_{j != k} exp(s_j - s_k + m))`` for a sample of meta-class ``k`` with proxy similarities
    ``s`` ``(B, K)`` from ``layers.ManifoldProxies``: ``L_cxt`` (eq. 12) for ``mode="contextual"``, ``L_int``
    (eq. 11) for ``"intrinsic"``, ``L_P*`` (eq. 4) for ``"direct"``. Margin ``m = 5e-4`` (Aziere and Todorovic 2019,
    Sec. 8). A sample whose label is outside ``0..K-1`` (-1, say) contributes zero, alike on every backend."""

    def __init__(self, margin=5e-4, name="manifold_proxy", reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.margin = float(check_non_negative("margin", margin))

    def call(self, y_true, y_pred):
        s = as_compute_dtype(y_pred)
        check_prediction_shape(self, s, 2, "the (B, num_classes) proxy similarities of ManifoldProxies")
        labels = class_labels(self, y_true, s)
        if is_empty_batch(s) and self.reduction not in (None, "none"):
            return zero_loss(s)  # Keras leaves a (0,) result of per-example values unreduced
        own = label_columns(labels, ops.shape(s)[1])  # (B, K); no column for a label outside 0..K-1
        positive = ops.sum(ops.where(own, s, ops.zeros_like(s)), axis=1, keepdims=True)  # (B, 1)
        exponents = ops.where(own, ops.full_like(s, -float("inf")), s - positive + self.margin)
        loss = ops.softplus(ops.logsumexp(exponents, axis=1))
        return ops.where(ops.any(own, axis=1), loss, ops.zeros_like(loss))

    def get_config(self):
        config = super().get_config()
        config.update(margin=self.margin)
        return config
