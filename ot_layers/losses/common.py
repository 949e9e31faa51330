"""What every loss of this package shares: the check of its integer labels, the loss of an empty batch and the
scaling of a scalar batch loss by the number of replicas."""
from keras import ops

from ot_layers.backends import replicas_in_sync
from ot_layers.validation import check_class_labels


def class_labels(loss, y_true, y_pred):
    """The integer labels ``(B,)`` of ``y_true`` ``(B,)`` or ``(B, 1)``, checked against the rows of ``y_pred``."""
    check_class_labels(type(loss).__name__, y_true, y_pred)
    return ops.reshape(ops.cast(y_true, "int32"), (-1,))


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
