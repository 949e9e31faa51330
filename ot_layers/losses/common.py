"""What every loss of this package shares: the checks of its integer labels and of the shape of ``y_pred``, the loss
of an empty batch, the scaling of a scalar batch loss by the number of replicas, and the refusal of per-sample
weights by the losses that are one value for the whole batch. (The labels' columns, a label
outside the classes in none, are ``ot_layers.tensor_ops.label_columns``, which the layers use too.)"""
import keras
from keras import ops

from ot_layers.backends import replicas_in_sync
from ot_layers.validation import check_class_labels


def class_labels(loss, y_true, y_pred):
    """The integer labels ``(B,)`` of ``y_true`` ``(B,)`` or ``(B, 1)``, checked against the rows of ``y_pred``."""
    check_class_labels(type(loss).__name__, y_true, y_pred)
    return ops.reshape(ops.cast(y_true, "int32"), (-1,))


def check_prediction_shape(loss, y_pred, rank, expected, min_columns=None, columns_note=None):
    """``y_pred`` of ``loss`` must have the static rank ``rank`` and, where ``min_columns`` is given, at least that
    many entries along axis 1 (the classes; an unknown size passes); else one ``ValueError`` naming ``y_pred``, the
    loss and ``expected``, the shape it takes (``"embeddings of shape (B, d)"``, say), with ``columns_note``
    (``"num_classes >= 2"``, say) for a short axis 1. Before this a wrong rank failed deep inside the loss (a
    broadcast error in TensorFlow's SelectV2, an IndexError) and a short axis 1 gave a loss that trains nothing."""
    try:
        shape = tuple(y_pred.shape)
    except ValueError:  # TensorFlow: a shape of unknown rank while tracing; nothing to check statically
        return
    owner = type(loss).__name__
    if len(shape) != rank:
        raise ValueError(f"`y_pred` of {owner} must be {expected}, got shape {shape}.")
    if min_columns is not None and shape[1] is not None and int(shape[1]) < min_columns:
        raise ValueError(f"`y_pred` of {owner} must be {expected} with {columns_note}, got shape {shape}.")


def is_empty_batch(y_pred):
    """Whether ``y_pred`` has a static batch size of 0 (under a traced, unknown batch size the losses' sums and
    means handle the empty case themselves: the metric losses' means divide by at least 1)."""
    return len(y_pred.shape) > 0 and y_pred.shape[0] == 0


def zero_loss(y_pred):
    """A scalar 0 in ``y_pred``'s dtype with a zero gradient to it: the loss of an empty batch."""
    return ops.sum(y_pred) * 0.0


def per_replica(batch_loss):
    """A batch loss scaled by ``1 / replicas``: Keras sums the replicas' gradients and divides a loss by the number
    of replicas only when it reduces per-example values itself; these losses return their batch value as a scalar,
    so each replica's share is divided here (under one replica, and on JAX and PyTorch, nothing changes). Each
    replica's value is computed on its own share of the batch (pairs and proxies' hardest terms within that
    share)."""
    if len(batch_loss.shape) != 0:  # per-example values: Keras reduces them over the batch and the replicas
        return batch_loss
    replicas = replicas_in_sync()
    return batch_loss if replicas == 1 else batch_loss / float(replicas)


class KeepsDType:
    """Mixin (before ``keras.losses.Loss``) whose config keeps the dtype the loss computes in: Keras' own
    ``Loss.get_config`` keeps only ``name`` and ``reduction``, so a ``dtype="float64"`` loss read back from a config
    or a ``.keras`` file computed in float32."""

    def get_config(self):
        config = super().get_config()
        if self.dtype != keras.backend.floatx():  # the default stays the reader's floatx
            config["dtype"] = self.dtype
        return config


class BatchLevelLoss:
    """Mixin (before ``keras.losses.Loss``) for a loss that is one value for the whole batch (its pairs, proxies or
    ridge maps mix the samples): it refuses ``sample_weight``, and so ``fit``'s ``class_weight``, which Keras would
    otherwise apply by multiplying that value by the weights' mean, silently (weights ``[1, 1, 1, 1, 1, 0]`` gave
    5/6 of the loss, not the loss without the sixth sample). For the same reason it refuses ``reduction="none"``
    (there are no per-sample values to return); the other reductions of one value are that value."""

    def __init__(self, *args, reduction="sum_over_batch_size", **kwargs):
        if reduction is None or reduction == "none":
            raise ValueError(f"`reduction`: {type(self).__name__} is one value for the whole batch (its samples are "
                             f"compared with one another), so it has no per-sample values for reduction="
                             f"{reduction!r}; use the default 'sum_over_batch_size'.")
        super().__init__(*args, reduction=reduction, **kwargs)

    def __call__(self, y_true, y_pred, sample_weight=None):
        if sample_weight is not None:
            raise ValueError(f"`sample_weight`: {type(self).__name__} is one value for the whole batch (its "
                             "samples are compared with one another), so per-sample weights (sample_weight, "
                             "class_weight) cannot weight it; leave them out, or sample the batches as you want "
                             "them weighted (training.data.ClassBalancedBatches).")
        return super().__call__(y_true, y_pred)

