"""Tensor helpers shared by several solvers, layers and callbacks (``keras.ops`` and NumPy twins).

One place for the small pieces every method needs: flattening a feature map into a set, normalizing rows, squared
Euclidean distances between two point sets, and finding the layer a callback drives. Keeping them here means one
definition of each guard (the ``1e-12`` floor of a norm, the clamp of a squared distance at 0).
"""
import keras
import numpy as np
from keras import ops

NORM_FLOOR = 1e-12  # NumPy: rows with a smaller norm are left (numerically) at zero instead of dividing by zero
SQUARED_NORM_FLOOR = 1e-12  # keras.ops: as tf.math.l2_normalize, so the gradient at a zero row stays ~1e6 (fp16-safe)


def flatten_feature_map(features):
    """``(B, H, W, d)`` -> ``(B, H*W, d)`` (unknown spatial size allowed); ``(B, n, d)`` passes through."""
    if len(features.shape) == 4:
        h, w, d = features.shape[1], features.shape[2], features.shape[3]
        if h is not None and w is not None:
            return ops.reshape(features, (-1, h * w, d))
        return ops.reshape(features, (ops.shape(features)[0], -1, d))  # one unknown axis at most for a reshape
    return features


def flatten_feature_map_np(features):
    """NumPy twin of :func:`flatten_feature_map` for callbacks: ``(..., d)`` -> ``(N, d)`` float64 rows."""
    features = np.asarray(features)
    return features.reshape(-1, features.shape[-1]).astype(np.float64)


def dtype_name(x):
    """The name of ``x``'s dtype (``"float32"``, ``"int32"``, ...) on any backend."""
    return keras.backend.standardize_dtype(x.dtype)


def compute_dtype(dtype):
    """The dtype the solvers, OT layers and losses compute in: float64 for float64, float32 for everything else
    (float16 and bfloat16 under mixed precision too). Takes any backend's dtype or its name; returns the name."""
    return "float64" if keras.backend.standardize_dtype(dtype) == "float64" else "float32"


def as_compute_dtype(x):
    """``x`` as a backend tensor in :func:`compute_dtype` of its dtype."""
    x = ops.convert_to_tensor(x)
    return ops.cast(x, compute_dtype(x.dtype))


def at_least(x, floor):
    """``max(x, floor)`` elementwise for a Python number or tensor ``floor``, in ``x``'s dtype. Used instead of
    ``keras.ops.maximum``, which on Keras' PyTorch backend (3.15) computes float64 tensors in float32. NaN stays NaN
    (as ``tf.maximum``); at a tie the gradient goes to ``x``."""
    floor = ops.full_like(x, floor) if isinstance(floor, (int, float)) else floor
    return ops.where(x < floor, floor, x)


def normalize_rows(x, axis=-1):
    """``x / max(||x||, 1e-6)`` along ``axis`` (``x * rsqrt(max(||x||^2, 1e-12))`` like
    ``tf.math.l2_normalize``); an all-zero row stays zero with a finite gradient, never NaN."""
    squared = ops.sum(ops.square(x), axis=axis, keepdims=True)
    return x * ops.rsqrt(at_least(squared, SQUARED_NORM_FLOOR))


def normalize_rows_np(x, axis=-1):
    """NumPy twin of :func:`normalize_rows` (float64 unless ``x`` is already floating)."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=axis, keepdims=True), NORM_FLOOR)


def squared_distances_np(points, centers):
    """``||points_i - centers_j||^2`` ``(N, M)`` for ``(N, d)`` and ``(M, d)`` arrays (clamped at 0)."""
    points = np.asarray(points, dtype=np.float64)
    centers = np.array(centers, dtype=np.float64)  # a copy: `p @ p.T` on one buffer takes a slow BLAS path
    sq = (points * points).sum(-1)[:, None] + (centers * centers).sum(-1)[None, :] - 2.0 * points @ centers.T
    return np.maximum(sq, 0.0)


def label_columns(labels, num_classes):
    """Boolean ``(B, num_classes)``: row ``i`` is true in column ``labels[i]`` only, and all false for a label
    outside ``0..num_classes-1`` (-1 for an unlabelled sample, say). By comparison, not by gather, so that such a
    label is the same on every backend (a gather took the last column for -1, and for ``num_classes`` raised on
    TensorFlow's CPU, gave zeros or NaN on a GPU and another value on PyTorch). The losses' policy for such a sample,
    documented in each: it contributes zero (``ops.any(label_columns(...), axis=1)`` is false for it); in
    ``SupportClassMeans`` it belongs to no class."""
    return ops.equal(ops.arange(num_classes, dtype="int32")[None, :], ops.reshape(labels, (-1, 1)))


def walk_layers(model, include_self=False):
    """Every layer of ``model`` once, depth first: the layers of nested models and the sub-layers a layer holds
    (e.g. ``StructuredFC``'s ``EMDHead``) included; ``model`` itself first with ``include_self``. The one walk the
    project uses (export checks, callbacks, explain); it relies on Keras' tracked sub-layers
    (``Layer._flatten_layers``), so a layer is found wherever Keras would save its weights."""
    yield from model._flatten_layers(include_self=include_self, recursive=True)


def layer_input_model(model, layer, inputs=None):
    """A functional ``keras.Model`` from ``inputs`` (default ``model.inputs``) to what ``layer`` receives when
    ``model`` runs: ``layer`` may sit in ``model`` itself or inside a functional model nested in it, at any depth
    (e.g. an embedding model used as a layer of a training model), which a plain ``keras.Model(model.inputs,
    layer.input)`` cannot reach (``layer.input`` then belongs to the nested model's own graph). A nested model is
    entered through the call of it that ``model``'s graph holds, with the tensors of that call (not its keyword
    arguments: a ``training=False`` given there is not kept, so call the result in inference mode). Callbacks use
    it to read the features their layer sees (``GSPPrototypeInit``, ``CCPReinitialization``, ``LayerSignals``)."""
    inputs = model.inputs if inputs is None else inputs
    if any(own is layer for own in model.layers):
        return keras.Model(inputs, layer.input)
    for nested in model.layers:
        if not isinstance(nested, keras.Model) or not any(own is layer for own in walk_layers(nested)):
            continue
        inner = layer_input_model(nested, layer)
        # The call of ``nested`` in this graph: the one of its inbound nodes whose inputs ``inputs`` reach (a model
        # can be called in several graphs). Keras 3 keeps a layer's calls in ``_inbound_nodes`` only.
        for node in nested._inbound_nodes:
            fed = node.input_tensors
            try:
                keras.Model(inputs, fed)
            except ValueError:  # not connected to ``inputs``: a call in another graph
                continue
            return keras.Model(inputs, inner(fed[0] if len(fed) == 1 else fed))
    return keras.Model(inputs, layer.input)  # a layer outside the graph: Keras' own error names it


def find_layer(model, layer_class, layer_name=None):
    """The layer named ``layer_name`` (or, with ``None``, the only ``layer_class`` instance) in ``model``,
    searched by :func:`walk_layers` (``model`` itself included). Raises ``ValueError`` naming ``layer_name`` when
    none or several match; the message lists the model's ``layer_class`` layers, or says which class a layer of
    that name has instead."""
    layers = list(walk_layers(model, include_self=True))
    of_class = [layer for layer in layers if isinstance(layer, layer_class)]
    found = [layer for layer in of_class if layer_name is None or layer.name == layer_name]
    if len(found) == 1:
        return found[0]
    kind = layer_class.__name__
    names = ", ".join(repr(layer.name) for layer in of_class)
    if len(found) > 1:
        which = f"named {layer_name!r}" if layer_name else f"(pass `layer_name` to choose one of {names})"
        raise ValueError(f"`layer_name`: expected exactly one {kind} layer {which} in the model, found {len(found)}.")
    hint = f"its {kind} layers: {names}" if of_class else "the model has none"
    others = [type(layer).__name__ for layer in layers if layer_name is not None and layer.name == layer_name]
    if others:
        hint += f"; the layer named {layer_name!r} is a {others[0]}"
    what = f"named {layer_name!r} " if layer_name else ""
    raise ValueError(f"`layer_name`: expected exactly one {kind} layer {what}in the model, found none ({hint}).")
