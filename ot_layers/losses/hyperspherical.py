"""The DL2PA pull loss on cosine logits (Saadabadi et al. 2024)."""
import keras
from keras import ops


@keras.saving.register_keras_serializable(package="ot_layers")
class HypersphericalPullLoss(keras.losses.Loss):
    """``L = (1 - cos(z, p_{sigma(y)}))^2`` (Saadabadi et al. 2024, Sec. 3.1, the prototype loss), computed from the
    logits ``s_k = cos(z, p_{sigma(k)})`` of ``layers.HypersphericalPrototypes`` as ``(1 - s_y)^2``: a pull towards the
    assigned prototype only, no push from the others. ``y_true``: integer labels ``(B,)`` or ``(B, 1)``."""

    def __init__(self, name="hyperspherical_pull", reduction="sum_over_batch_size", dtype=None):
        super().__init__(name=name, reduction=reduction, dtype=dtype)

    def call(self, y_true, y_pred):
        labels = ops.reshape(ops.cast(y_true, "int32"), (-1, 1))
        cosine = ops.take_along_axis(ops.cast(y_pred, "float32"), labels, axis=1)[:, 0]
        return ops.square(1.0 - cosine)

