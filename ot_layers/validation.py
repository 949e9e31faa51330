"""Argument checks shared by solvers, layers, callbacks and the data pipelines.

Every check raises ``ValueError`` (or ``TypeError``) whose message names the offending argument and the
accepted values, so bad input fails at the boundary instead of producing NaN later.
"""
import numbers
import os
import tempfile

import numpy as np


def check_positive(name, value, allow_none=False):
    """``value`` must be a finite real number > 0."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a finite number > 0, got {value!r}.")
    return value


def check_non_negative(name, value):
    """``value`` must be a finite real number >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value) or value < 0:
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
    return value


def check_positive_int(name, value):
    """``value`` must be an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
    return int(value)


MAX_SEED = 2 ** 32 - 1  # the largest seed NumPy's legacy generators and keras.utils.set_random_seed take


def check_non_negative_int(name, value):
    """``value`` must be an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"`{name}` must be an integer >= 0, got {value!r}.")
    return int(value)


def check_seed(name, value):
    """``value`` must be an integer >= 0 (what NumPy's generators accept as a seed)."""
    return check_non_negative_int(name, value)


def check_finite(name, value):
    """``value`` must be a finite real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    return float(value)


def check_flag(name, value):
    """``value`` must be ``True`` or ``False`` (a string such as ``"no"`` would read as true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False, got {value!r}.")
    return bool(value)


def check_in_range(name, value, low, high, low_open=False, high_open=False):
    """``value`` must lie in the interval between ``low`` and ``high`` (open or closed ends)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and np.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"`{name}` must lie in {interval}, got {value!r}.")
    return value


def check_choice(name, value, choices):
    """``value`` must be one of ``choices``."""
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {sorted(choices)!r}, got {value!r}.")
    return value


def check_rank(name, shape, ranks):
    """The static rank of ``shape`` must be one of ``ranks``."""
    rank = len(shape)
    if rank not in ranks:
        expected = " or ".join(str(r) for r in ranks)
        raise ValueError(f"`{name}` must have rank {expected}, got shape {tuple(shape)} (rank {rank}).")


def check_input_pair(layer, inputs):
    """``inputs`` (tensors, or their shapes as Keras passes them to ``build``) as the pair ``layer`` is called on,
    named by its class attribute ``INPUT_NAMES``; else a ``ValueError`` saying what came instead. A layer checks its
    first call's inputs in ``build``: raised in ``call``, the message would reach the user inside Keras' several-line
    report of the failed call."""
    sequence = isinstance(inputs, (list, tuple))
    is_shape = sequence and all(isinstance(item, (int, type(None))) for item in inputs)  # one tensor's shape
    if sequence and not is_shape:
        if len(inputs) == 2:
            return inputs
        got = f"{len(inputs)} input" + ("s" if len(inputs) != 1 else "")
    else:
        shape = inputs if is_shape else getattr(inputs, "shape", None)
        got = f"one tensor of shape {tuple(shape)}" if shape is not None else type(inputs).__name__
    first, second = layer.INPUT_NAMES
    raise ValueError(f"{type(layer).__name__} expects `inputs=[{first}, {second}]` (a list of two tensors), got "
                     f"{got}.")


def check_same_dim(name_a, dim_a, name_b, dim_b):
    """Two static dimensions must agree (unknown dimensions pass)."""
    if dim_a is not None and dim_b is not None and int(dim_a) != int(dim_b):
        raise ValueError(
            f"The feature dimension of `{name_a}` ({dim_a}) does not match that of `{name_b}` ({dim_b})."
        )


def check_class_labels(owner, y_true, y_pred):
    """``y_true`` of the loss ``owner`` must hold integer class labels ``(B,)`` or ``(B, 1)``, one for each of the
    ``B`` rows of ``y_pred`` (static shapes; an unknown size passes). One-hot labels ``(B, C)`` fail here, with the
    hint to pass their argmax, instead of in a broadcast deep inside the loss."""
    check_labels_per_row(f"`y_true` of {owner}", y_true, "`y_pred`", y_pred)


def check_labels_per_row(labels_name, labels, rows_name, rows):
    """``labels`` (named ``labels_name``) must hold integer class labels ``(B,)`` or ``(B, 1)``, one for each of the
    ``B`` rows of ``rows`` (named ``rows_name``), judged on static shapes (an unknown size passes)."""
    def static_shape(x):  # a tensor's static shape; a list's NumPy shape
        return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)

    try:
        shape = static_shape(labels)
    except ValueError:  # TensorFlow: a shape of unknown rank while tracing; nothing to check statically
        return
    try:
        rows_shape = static_shape(rows)
    except ValueError:
        rows_shape = None
    check_label_shape(labels_name, shape, rows_name, rows_shape)


def check_label_shape(labels_name, shape, rows_name, rows_shape):
    """:func:`check_labels_per_row` on the static shapes themselves (``rows_shape`` ``None``: unknown)."""
    shape = tuple(shape)
    count = rows_shape[0] if rows_shape else None
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[1] not in (1, None)):
        hint = ""
        if len(shape) == 2:
            hint = (f"; for a row of {count} labels pass it flattened, of shape ({count},)"
                    if shape[0] == 1 and count is not None and shape[1] == count
                    else "; for one-hot labels pass their argmax")
        raise ValueError(f"{labels_name} must hold integer class labels of shape (B,) or (B, 1), "
                         f"got shape {shape}{hint}.")
    if shape[0] is not None and count is not None and int(shape[0]) != int(count):
        raise ValueError(f"{labels_name} holds {shape[0]} labels for the {count} rows of {rows_name}.")


def check_image_array(name, images):
    """``images`` as a NumPy array of at least one image (a batch axis first) with finite values, else a
    ``ValueError`` naming ``name``. Callbacks embed such arrays epochs into training; a NaN pixel may come out of a
    backbone as a finite constant (max pooling drops NaN), so the pixels themselves are checked."""
    if images is None or isinstance(images, (str, bytes)):
        raise ValueError(f"`{name}` must be an array of images (N, ...), got {images!r}.")
    array = np.asarray(images)
    if array.ndim < 2 or len(array) == 0:
        raise ValueError(f"`{name}` must be a non-empty array of images (N, ...), got shape {array.shape}.")
    if not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"`{name}` must hold numbers, got dtype {array.dtype}.")
    if np.issubdtype(array.dtype, np.inexact) and not np.all(np.isfinite(array)):
        raise ValueError(f"`{name}` holds NaN or Inf.")
    return array


def _fits_input(shape, expected):
    """Whether a batch of ``shape`` fits a model input of batch shape ``expected``: the batch axis and ``None``
    dims match anything, and a trailing axis of size 1 may be extra or missing (Keras squeezes or adds it)."""
    if len(shape) == len(expected) + 1 and shape[-1] == 1:
        shape = shape[:-1]
    elif len(shape) == len(expected) - 1 and expected[-1] == 1:
        shape = shape + (1,)
    return len(shape) == len(expected) and all(want is None or want == got
                                               for want, got in zip(expected[1:], shape[1:]))


def check_fits_model_inputs(name, batches, model, what="the model", first_input_only=False):
    """``batches`` (an array with the batch axis first, or a list or tuple with one such array per input) must
    fit the inputs of the Keras ``model`` as far as their shapes are known (see :func:`_fits_input`), else one
    ``ValueError`` naming ``name`` and ``what`` (the model as the user knows it), e.g. "`train_images`: the
    embedding model takes inputs of shape (None, 4), got shape (10, 5)." Callbacks call it when they learn the
    model, before any epoch: Keras' own error would come epochs later and name an internal sub-model.

    A single array must meet a model with one input, or with ``first_input_only`` the model's first input. A model
    whose inputs are not known (subclassed, or a ``Sequential`` without an ``Input``) passes: Keras checks when it
    runs. Only shapes are read (``model.inputs``), so it works alike on every backend."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return
    expected = [tuple(tensor.shape) for tensor in inputs]
    if isinstance(batches, (list, tuple)):
        shapes = [tuple(np.shape(batch)) for batch in batches]
        if len(shapes) != len(expected):
            raise ValueError(f"`{name}`: {what} takes {len(expected)} input(s), got a list of {len(shapes)} "
                             f"arrays.")
        for index, (shape, want) in enumerate(zip(shapes, expected)):
            if not _fits_input(shape, want):
                raise ValueError(f"`{name}` part {index}: input {index} of {what} takes batches of shape {want}, "
                                 f"got shape {shape}.")
        return
    shape = tuple(np.shape(batches))
    if len(expected) > 1 and not first_input_only:
        raise ValueError(f"`{name}`: {what} takes {len(expected)} inputs, of shapes "
                         f"{', '.join(str(want) for want in expected)}, got one array of shape {shape}.")
    if not _fits_input(shape, expected[0]):
        which = what if len(expected) == 1 else f"input 0 of {what}"
        raise ValueError(f"`{name}`: {which} takes inputs of shape {expected[0]}, got shape {shape}.")


def check_embedding_width(name, shape, width, what):
    """Embeddings of ``shape`` from the Keras model ``name`` (a callback argument) must be vectors ``(batch, width)``,
    the width ``what`` takes (e.g. "the ManifoldProxies layer 'head' (its `dim`)"), else one ``ValueError`` naming
    both (``width=None``: any width, vectors only). Without this, a model of another width failed epochs later, at
    the first proxy update, in a shape error that named neither."""
    shape = tuple(shape)
    if len(shape) != 2 or (width is not None and shape[-1] not in (None, width)):
        raise ValueError(f"`{name}` gives embeddings of shape {(None,) + shape[1:]}, but {what} takes vectors of "
                         f"shape (None, {'d' if width is None else width}).")


def check_model_embedding_width(name, model, width, what):
    """:func:`check_embedding_width` on the output of the Keras ``model``, as far as it is known before the model
    runs: True when checked, False for a model whose outputs are unknown (subclassed), to be checked once it has run.
    A model of several outputs is refused."""
    outputs = getattr(model, "outputs", None)
    if not outputs:
        return False
    if len(outputs) != 1:
        raise ValueError(f"`{name}` gives {len(outputs)} outputs, but {what} takes one batch of vectors of shape "
                         f"(None, {width}).")
    check_embedding_width(name, outputs[0].shape, width, what)
    return True


_INT32 = np.iinfo(np.int32)


def check_labels(labels, name="labels"):
    """``labels`` as an array of integer class labels ``(N,)`` or ``(N, 1)``: whole numbers (of an integer, boolean
    or float dtype) in int32's range, -1 for an unlabelled sample included; else a ``ValueError`` naming ``name``.
    Batches and callbacks cast labels to int32, which would turn 1.7 into 1, NaN into -2**31 and 2**40 into 0
    without a word."""
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


def check_class_ids(labels, name):
    """``labels`` checked (``ot_layers.validation.check_labels``) and flattened to ``(N,)``, with no negative label:
    else a ``ValueError`` naming ``name``. The losses and layers read -1 as an unlabelled sample (it belongs to no
    class), but drawn by class it would be one more class: a P x K batch of unlabelled samples, an episode class of
    them, or, in retrieval metrics, neighbours that count as relevant to each other."""
    labels = check_labels(labels, name).reshape(-1)
    if labels.size and labels.min() < 0:
        raise ValueError(f"`{name}` must be class ids >= 0, got {labels.min()}: a negative label (-1 for an "
                         f"unlabelled sample, say) is no class to draw or score; leave those samples out.")
    return labels


def output_path_problem(path, directory):
    """Why ``path`` cannot be written, or ``None``: a directory to write into (``directory=True``: an existing
    directory or none yet) or a file (a new one, or one to replace; not a directory), never below a file, and
    where this process can create what it writes: the nearest existing directory on the way (the directory itself
    when it exists; a file's folder) must be writable and searchable, and a directory made in it (at once removed)
    must come into being, which a read-only mount or a virtual file system such as ``/proc`` refuses even to root,
    whom the permission bits do not stop."""
    kind = "directory" if directory else "file"
    if not isinstance(path, (str, os.PathLike)):
        return f"must be a {kind} path, got {path!r}"
    if not str(os.fspath(path)).strip():
        return f"is empty; give a {kind}"
    full = os.path.abspath(os.fspath(path))
    existing = full
    while not os.path.exists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if existing != full and not os.path.isdir(existing):
        return f"{os.fspath(path)!r} is below the file {existing!r}; give a {kind}"
    if directory and existing == full and not os.path.isdir(full):
        return f"{os.fspath(path)!r} is a file; give a directory"
    if not directory and os.path.isdir(full):
        return f"{os.fspath(path)!r} is a directory; give a file path"
    folder = existing if os.path.isdir(existing) else os.path.dirname(existing)  # an existing file: its folder
    problem = _creation_problem(folder)
    if problem:
        return f"{os.fspath(path)!r} cannot be written: {problem}; give a {kind} in a writable place"
    return None


def _creation_problem(folder):
    """Why nothing can be created in the existing directory ``folder``, or ``None``: it must be writable and
    searchable (``os.access``), and a probe directory must be made in it (and is removed again)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder!r} is not writable by this user"
    try:
        probe = tempfile.mkdtemp(prefix=".otzoo-write-check-", dir=folder)
    except OSError as error:  # a read-only file system, /proc, a full disk
        return f"nothing can be created in {folder!r} ({error.strerror or type(error).__name__})"
    try:
        os.rmdir(probe)
    except FileNotFoundError:  # removed by another process already
        pass
    return None


def check_output_path(name, path, directory):
    """``path`` as a string, or one ``ValueError`` naming ``name`` where :func:`output_path_problem` finds one,
    checked before any work whose result would then have nowhere to go."""
    problem = output_path_problem(path, directory)
    if problem:
        raise ValueError(f"`{name}` {problem}.")
    return os.fspath(path)
