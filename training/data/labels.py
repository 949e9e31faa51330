"""The check of integer class labels that every batch pipeline and sampler applies to its ``labels``."""
import numpy as np

_INT32 = np.iinfo(np.int32)


def check_labels(labels, name="labels"):
    """``labels`` as an array of integer class labels ``(N,)`` or ``(N, 1)``: whole numbers (of an integer, boolean
    or float dtype) in int32's range, -1 for an unlabelled sample included; else a ``ValueError`` naming ``name``.
    Batches cast labels to int32, which would turn 1.7 into 1, NaN into -2**31 and 2**40 into 0 without a word."""
    array = np.asarray(labels)
    if array.ndim not in (1, 2) or (array.ndim == 2 and array.shape[1] != 1):
        hint = "; for one-hot labels pass their argmax" if array.ndim == 2 else ""
        raise ValueError(f"`{name}` must be integer class labels of shape (N,), got shape {array.shape}{hint}.")
    if array.dtype == bool or np.issubdtype(array.dtype, np.integer):
        whole = np.ones(array.shape, bool)
    elif np.issubdtype(array.dtype, np.floating):
        whole = np.isfinite(array) & (array == np.round(array))
    else:
        raise ValueError(f"`{name}` must be integer class labels, got an array of dtype {array.dtype}.")
    if not whole.all():
        raise ValueError(f"`{name}` must be integer class labels, got {array.reshape(-1)[~whole.reshape(-1)][0]!r} "
                         f"(dtype {array.dtype}).")
    if array.size and (array.min() < _INT32.min or array.max() > _INT32.max):
        raise ValueError(f"`{name}` must lie in int32's range, got values from {array.min()} to {array.max()}.")
    return array
