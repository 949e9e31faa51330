"""What to draw, pulled out of a model exactly as its layers compute it (pure functions of a model and images).

Each function runs the model up to the layer's input, then repeats the layer's own computation with the layer's
weights and the solver call the layer makes, keeping the intermediate quantities the layer sums away:

- :func:`mpw_plans`: ``MultiProxyWasserstein``'s transport plans, via the layer's own ``matcher.match`` (its
  public Sinkhorn call); the logits are ``sum_jm T[j, m] <x_j, p_m>`` as the layer sums them.
- :func:`gsp_weights`: ``GeneralizedSumPooling``'s pooling weights (its public ``pooling_weights``, what ``pool``
  sums the features with); the pooled vector is ``sum_j w_j f_j``.
- :func:`emd_flows`: ``EMDHead``'s flows and node weights (its public ``transport``, what ``similarity`` reads);
  the logits are ``scale * sum_ij (1 - c_ij) T_ij``.
- :func:`prototype_geometry`: ``HypersphericalPrototypes``' prototypes, assignment and class representatives.
- :func:`image_embeddings` / :func:`nearest_neighbours`: what a retrieval panel ranks.
- :func:`read_training_log`: a Keras ``CSVLogger`` file as columns.

Every result also carries the logits (or pooled vector) recomputed from the extracted quantities, so a caller (and
``tests/test_explain_signals.py``) can check them against the model's own output.
"""
import csv
import os
from typing import NamedTuple

import keras
import numpy as np
from keras.ops import convert_to_numpy

from explain.images import model_input_shape, prepare_images
from ot_layers.layers.emd_head import EMDHead
from ot_layers.layers.generalized_sum_pooling import GeneralizedSumPooling
from ot_layers.layers.hyperspherical_prototypes import HypersphericalPrototypes
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.tensor_ops import find_layer, flatten_feature_map, normalize_rows_np
from ot_layers.validation import check_positive_int

# Fashion-MNIST's label names, in label order (Xiao et al. 2017).
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                         "Ankle boot")


def layer_inputs(model, layer, inputs):
    """What ``layer`` receives when ``model`` runs on ``inputs`` in inference mode (NumPy; a list for a layer of
    several inputs). ``layer`` must be called once, in ``model``'s own graph (not inside a nested model)."""
    try:
        head = keras.Model(model.inputs[0] if len(model.inputs) == 1 else model.inputs, layer.input)
    except (ValueError, AttributeError) as error:
        raise ValueError(f"`model`: cannot read the input of layer {layer.name!r} from the model's inputs (the layer "
                         f"must be called once in the model's own graph): {error}") from None
    outputs = head(inputs, training=False)
    if isinstance(outputs, (list, tuple)):
        return [convert_to_numpy(x) for x in outputs]
    return convert_to_numpy(outputs)


def _grid(feature_map):
    """``(h, w)`` of a feature map ``(B, h, w, d)``; a set ``(B, n, d)`` has no grid (``None``)."""
    return tuple(feature_map.shape[1:3]) if feature_map.ndim == 4 else None


def _images(model, images):
    return prepare_images(images, model_input_shape(model))


class MPWPlans(NamedTuple):
    """The transport plans of a ``MultiProxyWasserstein`` head (``n = h * w`` cells, ``M`` proxies per class).

    plans ``(B, K, n, M)``: ``T_k`` for every class ``k`` (rows sum to ``1/n``, columns to ``1/M`` up to the
    solver's tolerance); inner ``(B, K, n, M)``: ``<x_j, p_km>``; logits ``(B, K)``: ``sum_jm T * inner``;
    grid ``(h, w)``: the feature map's size (``None`` for a set input).
    """

    plans: np.ndarray
    inner: np.ndarray
    logits: np.ndarray
    grid: tuple

    def contributions(self):
        """``(B, K, n)``: each cell's share of each class's logit, ``sum_m T[j, m] <x_j, p_m>``."""
        return np.sum(self.plans * self.inner, axis=-1)


def mpw_plans(model, images, layer_name=None):
    """The MPW head's plans for ``images`` (0-255 pixels, fitted to the model's input by
    :func:`explain.images.prepare_images`), computed by the head's own matcher on its own proxies."""
    layer = find_layer(model, MultiProxyWasserstein, layer_name)
    features = layer_inputs(model, layer, _images(model, images))
    plan, inner, _ = layer.matcher.match(flatten_feature_map(keras.ops.convert_to_tensor(features)), layer.proxies)
    plan, inner = convert_to_numpy(plan), convert_to_numpy(inner)
    logits = np.sum(plan * inner, axis=(-2, -1))
    return MPWPlans(plan, inner, logits, _grid(features))


class GSPWeights(NamedTuple):
    """The pooling of a ``GeneralizedSumPooling`` layer.

    weights ``(B, n)``: ``w_j`` (sum to one; ``1/n`` everywhere is average pooling); features ``(B, n, C)``;
    pooled ``(B, C)``: ``sum_j w_j f_j``; grid ``(h, w)`` (``None`` for a set input).
    """

    weights: np.ndarray
    features: np.ndarray
    pooled: np.ndarray
    grid: tuple


def gsp_weights(model, images, layer_name=None):
    """The GSP layer's pooling weights over the feature map for ``images`` (see :class:`GSPWeights`)."""
    layer = find_layer(model, GeneralizedSumPooling, layer_name)
    features = layer_inputs(model, layer, _images(model, images))
    flat = layer.flat_features(keras.ops.convert_to_tensor(features))
    weights = convert_to_numpy(layer.pooling_weights(flat)[0])
    flat = convert_to_numpy(flat)
    return GSPWeights(weights, flat, np.einsum("bn,bnc->bc", weights, flat), _grid(features))


class EMDFlows(NamedTuple):
    """The optimal flows of an ``EMDHead`` between each query and each class's node set.

    plans ``(B, K, n, m)``: flows ``T`` (rows sum to the query weights, columns to the class weights); cost
    ``(B, K, n, m)``: ``1 - cos``; query_weights ``(B, K, n)`` and support_weights ``(B, K, m)``: the node weights
    (cross-reference, or uniform); logits ``(B, K)``: ``scale * sum (1 - c) T``; query_grid / support_grid: the
    feature maps' ``(h, w)`` (``None`` for sets).
    """

    plans: np.ndarray
    cost: np.ndarray
    query_weights: np.ndarray
    support_weights: np.ndarray
    logits: np.ndarray
    query_grid: tuple
    support_grid: tuple


def episode_labels(support_labels, ways=None):
    """``support_labels`` as int32 ``(S,)``: whole numbers >= 0 (a cast would turn 1.7 into 1) and, given ``ways``,
    exactly the episode labels ``0..ways-1``, each with a support image (a class without one gets no flow); else a
    ``ValueError`` naming them."""
    labels = np.asarray(support_labels).reshape(-1)
    if labels.size == 0 or not np.issubdtype(labels.dtype, np.number) or not np.all(np.isfinite(labels)) \
            or np.any(labels != np.round(labels)) or labels.min() < 0:
        raise ValueError(f"`support_labels` must be episode labels 0..ways-1, got {labels.tolist()[:10]}.")
    labels = labels.astype(np.int32)
    if ways is not None and set(labels.tolist()) != set(range(ways)):
        raise ValueError(f"`support_labels` must be the episode labels 0..{ways - 1}, each with a support image (a "
                         f"class without one gets no flow); got {sorted(set(labels.tolist()))}.")
    return labels


def check_exclude(exclude, queries, gallery_size, name="exclude"):
    """``exclude`` as int ``(Q,)``: per query a gallery index in ``0..gallery_size-1`` to leave out, or -1; else a
    ``ValueError`` naming ``name``."""
    exclude = np.asarray(exclude).reshape(-1)
    if len(exclude) != queries or not np.issubdtype(exclude.dtype, np.integer) \
            or np.any((exclude < -1) | (exclude >= gallery_size)):
        raise ValueError(f"`{name}` must hold one gallery index in 0..{gallery_size - 1} (or -1 for none) per query "
                         f"({queries}), got {exclude.tolist()[:10]}.")
    return exclude


def emd_flows(model, query_images, support_images, support_labels, layer_name=None):
    """The EMD head's flows for a few-shot model ``[query_images, support_images, support_labels] -> logits``
    (``zoo.few_shot_model(..., head="emd")``): the node sets the head receives (query maps and class-mean support
    maps), then the head's own ``transport`` (cost, node weights, ``solvers.emd`` under its settings)."""
    layer = find_layer(model, EMDHead, layer_name)
    shape = model_input_shape(model)
    labels = episode_labels(support_labels)
    support = prepare_images(support_images, shape)
    if len(labels) != len(support):
        raise ValueError(f"`support_labels` has {len(labels)} entries for {len(support)} support images.")
    query_maps, class_maps = layer_inputs(model, layer, [prepare_images(query_images, shape), support, labels])
    cost, a, b, result = layer.transport(flatten_feature_map(keras.ops.convert_to_tensor(query_maps)),
                                         flatten_feature_map(keras.ops.convert_to_tensor(class_maps)))
    plans, cost = convert_to_numpy(result.plan), convert_to_numpy(cost)
    logits = layer.scale * np.sum((1.0 - cost) * plans, axis=(-2, -1))
    episode_labels(labels, logits.shape[-1])
    return EMDFlows(plans, cost, convert_to_numpy(a), convert_to_numpy(b), logits, _grid(query_maps),
                    _grid(class_maps))


class PrototypeGeometry(NamedTuple):
    """A ``HypersphericalPrototypes`` layer's state, by class.

    assigned ``(K, dim)``: row ``k`` the unit prototype of class ``k`` (``p_sigma(k)``); assignment ``(K,)``:
    ``sigma``; cosines ``(K, K)``: ``cos(p_sigma(i), p_sigma(j))``; alignment ``(K, K)`` or ``None``:
    ``cos(c_i, p_sigma(j))`` between class representatives and assigned prototypes (``None`` while the layer has
    no representatives yet, i.e. before training with labels).
    """

    assigned: np.ndarray
    assignment: np.ndarray
    cosines: np.ndarray
    alignment: np.ndarray


def prototype_geometry(model, layer_name=None):
    """The prototype geometry of the ``HypersphericalPrototypes`` layer in ``model`` (or the layer itself)."""
    layer = model if isinstance(model, HypersphericalPrototypes) else find_layer(model, HypersphericalPrototypes,
                                                                                 layer_name)
    assigned = normalize_rows_np(convert_to_numpy(layer.assigned_prototypes()).astype(np.float64))
    representatives = convert_to_numpy(layer.representatives).astype(np.float64)
    alignment = None
    if np.any(representatives):
        alignment = normalize_rows_np(representatives) @ assigned.T
    return PrototypeGeometry(assigned, convert_to_numpy(layer.assignment), assigned @ assigned.T, alignment)


class AssignmentHistory(keras.callbacks.Callback):
    """Records a ``HypersphericalPrototypes`` layer's ``assignment`` at the start of training and after every
    epoch (``assignments``: a list of ``(K,)`` arrays) for :func:`explain.plot_prototypes`. Put it after
    ``callbacks.PrototypeReassignment`` in the callback list so that it sees each epoch's re-assignment."""

    def __init__(self, layer_name=None):
        super().__init__()
        self.layer_name = layer_name
        self.assignments = []

    def _record(self):
        layer = find_layer(self.model, HypersphericalPrototypes, self.layer_name)
        self.assignments.append(convert_to_numpy(layer.assignment).copy())

    def on_train_begin(self, logs=None):
        if not self.assignments:
            self._record()

    def on_epoch_end(self, epoch, logs=None):
        self._record()


def _counts(values):
    """Counts as integers, or as floats with NaN where one is missing (``None``, NaN; ``astype(int)`` made a NaN
    -9223372036854775808)."""
    counts = np.array([np.nan if value is None else value for value in np.asarray(values).tolist()], dtype=float)
    return counts if np.isnan(counts).any() else counts.astype(int)


def assignment_changes(history):
    """Per-epoch counts of classes that changed prototype, from a history: a sequence of ``(K,)`` assignments
    (e.g. ``AssignmentHistory.assignments``: the counts are the differences of consecutive ones), a sequence of
    counts (``PrototypeReassignment.changes``), or a CSV log with a ``prototype_changes`` column.

    An epoch without a count (an empty or NA cell of the log, e.g. one the callback did not run at; ``None`` or NaN
    among the counts) is NaN, and the counts are then floats; else they are integers."""
    if isinstance(history, (str, os.PathLike)):
        columns = read_training_log(history)
        if "prototype_changes" not in columns:
            raise ValueError(f"`history`: the log {os.fspath(history)!r} has no 'prototype_changes' column.")
        return _counts(columns["prototype_changes"])
    array = np.asarray(history)
    if array.ndim == 2:
        return np.sum(array[1:] != array[:-1], axis=1)
    if array.ndim == 1:
        return _counts(array)
    raise ValueError(f"`history` must be a list of assignments (E, K), of counts (E,) or a CSV log path, got an "
                     f"array of shape {array.shape}.")


def feature_map_model(model):
    """``images -> the last feature map (B, h, w, d)`` of a single-input model: the input of its last layer that
    receives one (a zoo classifier's or embedding model's head or pooling layer, i.e. the backbone's output)."""
    for layer in reversed(model.layers):
        if isinstance(layer, (keras.Model, keras.layers.InputLayer)):
            continue  # a nested model's `input` is its own graph's, not this one's
        try:
            tensor = layer.input
        except (AttributeError, ValueError):
            continue
        if not isinstance(tensor, (list, tuple)) and len(tensor.shape) == 4:
            return keras.Model(model.inputs[0], tensor)
    raise ValueError(f"`model` {model.name!r} has no layer taking a feature map (B, H, W, C).")


def image_embeddings(model, images, batch_size=256):
    """Unit embeddings of ``images`` for retrieval and where they come from (a short description).

    An embedding model (one input, a ``(B, D)`` output, ending in an ``L2Normalization`` layer, as
    ``zoo.embedding_model`` builds) gives its own output; any other single-input model gives the L2-normalized
    global average of its last feature map (for a zoo classifier: the backbone's pooled features).
    """
    batch_size = check_positive_int("batch_size", batch_size)
    if len(model.inputs) != 1:
        raise ValueError(f"`model` must take images only for retrieval, {model.name!r} has {len(model.inputs)} "
                         "inputs.")
    images = _images(model, images)
    last = model.layers[-1]
    if len(model.outputs) == 1 and len(model.outputs[0].shape) == 2 and type(last).__name__ == "L2Normalization":
        return model.predict(images, batch_size=batch_size, verbose=0), f"{model.name} embeddings"
    maps = feature_map_model(model).predict(images, batch_size=batch_size, verbose=0)
    return normalize_rows_np(maps.mean(axis=(1, 2))), "pooled backbone features"


def nearest_neighbours(queries, gallery, k, exclude=None):
    """Indices ``(Q, k)`` and cosine similarities ``(Q, k)`` of each query's ``k`` most similar gallery rows, most
    similar first. ``exclude``: per query a gallery index to leave out (the query itself), or -1 / ``None``."""
    k = check_positive_int("k", k)
    queries = normalize_rows_np(np.asarray(queries, dtype=np.float64))
    gallery = normalize_rows_np(np.asarray(gallery, dtype=np.float64))
    scores = queries @ gallery.T
    if exclude is not None:
        exclude = check_exclude(exclude, len(queries), len(gallery))
        for row, index in enumerate(exclude):
            if index >= 0:
                scores[row, index] = -np.inf
    available = gallery.shape[0] - (0 if exclude is None else int(np.any(np.asarray(exclude) >= 0)))
    if k > available:
        raise ValueError(f"`k` must be at most the gallery size ({available}), got {k}.")
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


def read_training_log(path):
    """A Keras ``CSVLogger`` file as ``{column: float array}`` (an ``epoch`` column is required; empty cells are
    NaN)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`logs`: no training log at {path!r}.")
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or "epoch" not in rows[0]:
        raise ValueError(f"`logs`: {path!r} is not a Keras CSV log (no 'epoch' column or no rows).")
    columns = {}
    for name in rows[0]:
        values = []
        for row in rows:
            try:
                values.append(float(row[name]))
            except (TypeError, ValueError):
                values.append(np.nan)
        columns[name] = np.asarray(values)
    return columns
