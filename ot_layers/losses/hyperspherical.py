"""The DL2PA pull loss on cosine logits (Saadabadi et al. 2024)."""
import keras
from keras import ops

from ot_layers.losses.common import KeepsDType, check_prediction_shape, class_labels, is_empty_batch, zero_loss
from ot_layers.tensor_ops import as_compute_dtype, label_columns


@keras.saving.register_keras_serializable(package="ot_layers")
class HypersphericalPullLoss(KeepsDType, keras.losses.Loss):
    """``L = (1 - cos(z, p_{sigma(y)}))^2`` (Saadabadi et al. 2024, Sec. 3.2.2, Eq. 6), computed from the
    logits ``s_k = cos(z, p_{sigma(k)})`` of ``layers.HypersphericalPrototypes`` as ``(1 - s_y)^2``: a pull towards the
    assigned prototype only, no push from the others. ``y_true``: integer labels ``(B,)`` or ``(B, 1)``; a sample whose
    label is outside ``0..K-1`` (-1 for an unlabelled sample, say) contributes zero, alike on every backend, as the
    layer leaves it out of its class representatives."""

    def __init__(self, name="hyperspherical_pull", reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        logits = as_compute_dtype(y_pred)
        check_prediction_shape(self, logits, 2, "the (B, num_classes) cosine logits of HypersphericalPrototypes")
        labels = class_labels(self, y_true, logits)
        if is_empty_batch(logits) and self.reduction not in (None, "none"):
            return zero_loss(logits)  # Keras leaves a (0,) result of per-example values unreduced
        own = label_columns(labels, ops.shape(logits)[1])  # (B, K); no column for a label outside 0..K-1
        cosine = ops.sum(ops.where(own, logits, ops.zeros_like(logits)), axis=1)
        return ops.where(ops.any(own, axis=1), ops.square(1.0 - cosine), ops.zeros_like(cosine))

