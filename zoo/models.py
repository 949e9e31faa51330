"""Classification models assembled from a backbone's feature map and a head, with pixel preprocessing inside.

A zoo model takes raw pixel values (uint8 or float in 0-255) and normalizes them itself, so a served model needs no
client-side code: ``x -> (x / 255 - mean) / std`` is one ``Rescaling`` layer named ``preprocess``.

Heads by name (``CLASSIFICATION_HEADS``):

- ``"gap_fc"``: global average pooling (layer ``gap``) + ``Dense(num_classes)`` (``dense_head``), the baseline;
- ``"mpw"``: ``ot_layers.MultiProxyWasserstein`` on the whole feature map (``mpw_head``);
- ``"hyperspherical"``: DL2PA (Saadabadi et al. 2024): global average pooling (``gap``) + ``Dense(dim)``
  (``embedding``) + ``ot_layers.HypersphericalPrototypes(num_classes, dim)`` (``hyperspherical_head``), logits the
  cosines to the assigned prototypes. The layer needs the labels during training (its class representatives, read by
  ``callbacks.PrototypeReassignment``): train :func:`hyperspherical_training_model` (inputs ``[images, labels]``,
  same layers, same weights) and serve the classifier itself (inputs ``images``).

Retrieval and few-shot models are in :mod:`zoo.tasks`. The served models are ``ot_layers.TaskModel``s that state
their task (here ``"classification"``), which the exporters read.
"""
import numbers

import keras

from ot_layers.layers.hyperspherical_prototypes import HypersphericalPrototypes
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.task_model import TaskModel
from ot_layers.tensor_ops import find_layer
from ot_layers.validation import check_choice, check_positive, check_positive_int
from zoo.backbones import backbone as resolve_backbone
from zoo.head_layers import HeadLayer
from zoo.inputs import check_input_shape

# The layer of each head, and the arguments of it the builder sets (``head_kwargs`` may give the others).
CLASSIFICATION_HEAD_LAYERS = {
    "gap_fc": HeadLayer(keras.layers.Dense, ("units",)),
    "mpw": HeadLayer(MultiProxyWasserstein, ("num_classes",)),
    "hyperspherical": HeadLayer(HypersphericalPrototypes, ("num_classes",)),
}
CLASSIFICATION_HEADS = tuple(CLASSIFICATION_HEAD_LAYERS)


def pixel_preprocessing(mean, std, name="preprocess"):
    """``Rescaling`` that maps 0-255 pixels to ``(x / 255 - mean) / std`` (``mean``/``std`` in [0, 1] units)."""
    _check_pixel_statistics(mean, std, names=("mean", "std"))
    return keras.layers.Rescaling(scale=1.0 / (255.0 * std), offset=-float(mean) / std, name=name)


def check_kwargs(name, value):
    """``value`` must be ``None`` or a dict (of keyword arguments); returns a copy as a dict."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"`{name}` must be a dict of keyword arguments or None, got {type(value).__name__}.")
    return dict(value)


def _check_pixel_statistics(pixel_mean, pixel_std, names=("pixel_mean", "pixel_std")):
    """The statistics are in [0, 1] units (pixels / 255): a mean in [0, 1] and a std in (0, 1]. A NaN or infinite
    mean would turn every pixel into NaN; 0-255 statistics (a mean of 125) would scale the pixels 255 times too
    little; a string or a list failed inside ``float``."""
    if isinstance(pixel_mean, bool) or not isinstance(pixel_mean, numbers.Real) or not 0 <= pixel_mean <= 1:
        raise ValueError(f"`{names[0]}` must be a number in [0, 1] (the pixels' mean in [0, 1] units, pixels / 255), "
                         f"got {pixel_mean!r}.")
    check_positive(names[1], pixel_std)
    if pixel_std > 1:
        raise ValueError(f"`{names[1]}` must be in (0, 1] (the pixels' standard deviation in [0, 1] units, "
                         f"pixels / 255), got {pixel_std!r}.")


def image_input(backbone, input_shape=None, backbone_kwargs=None):
    """The feature extractor :func:`zoo.backbone` gives for ``backbone`` (a name, a Keras model or a
    ``keras.applications`` model without its top) and the model's ``images`` input: ``input_shape`` when given,
    else the backbone's own input shape."""
    backbone_kwargs = check_kwargs("backbone_kwargs", backbone_kwargs)
    if input_shape is not None:
        input_shape = check_input_shape(input_shape)
    extractor = resolve_backbone(backbone, input_shape, **backbone_kwargs)
    shape = input_shape if input_shape is not None else tuple(extractor.inputs[0].shape[1:])
    return extractor, keras.Input(shape, name="images")


def image_classifier(backbone, head="gap_fc", num_classes=10, pixel_mean=0.5, pixel_std=0.25, head_kwargs=None,
                     name=None, input_shape=None, backbone_kwargs=None):
    """``images (0-255) -> preprocess -> backbone feature map -> head -> logits (B, num_classes)``.

    ``backbone``: a name in ``zoo.BACKBONES`` (built for ``input_shape`` with ``backbone_kwargs``), a Keras model
    from images to a feature map ``(B, H, W, C)`` or a ``keras.applications`` model built with
    ``include_top=False`` (see :func:`zoo.backbone`); the model's input shape is ``input_shape`` or the backbone's.
    ``head``: one of ``CLASSIFICATION_HEADS``; ``head_kwargs`` go to the head layer: ``Dense`` for ``"gap_fc"``,
    ``MultiProxyWasserstein`` for ``"mpw"``, ``HypersphericalPrototypes`` for ``"hyperspherical"`` (whose ``dim``,
    default ``max(2, num_classes - 1)``, the simplex ETF's dimension (an ETF of K points needs ``dim >= K - 1``), is
    also the width of the ``embedding`` Dense layer). ``pixel_mean``/``pixel_std``: the data's pixel statistics in
    [0, 1] units.

    For ``"hyperspherical"`` the returned model is the inference model; train
    ``hyperspherical_training_model(model)`` with ``losses.HypersphericalPullLoss`` on ``fit([x, y], y)``.
    """
    check_choice("head", head, CLASSIFICATION_HEADS)
    num_classes = check_positive_int("num_classes", num_classes)
    head_kwargs = check_kwargs("head_kwargs", head_kwargs)
    CLASSIFICATION_HEAD_LAYERS[head].check("head_kwargs", head_kwargs)
    _check_pixel_statistics(pixel_mean, pixel_std)
    if head == "hyperspherical":
        if num_classes < 2:
            raise ValueError(f"`num_classes` must be >= 2 for the hyperspherical head, got {num_classes!r}.")
        dim = check_positive_int("dim", head_kwargs.pop("dim", max(2, num_classes - 1)))
    extractor, inputs = image_input(backbone, input_shape, backbone_kwargs)
    features = extractor(pixel_preprocessing(pixel_mean, pixel_std)(inputs))
    if head == "mpw":
        logits = MultiProxyWasserstein(num_classes, name="mpw_head", **head_kwargs)(features)
    elif head == "gap_fc":
        pooled = keras.layers.GlobalAveragePooling2D(name="gap")(features)
        logits = keras.layers.Dense(num_classes, name="dense_head", **head_kwargs)(pooled)
    else:
        pooled = keras.layers.GlobalAveragePooling2D(name="gap")(features)
        embedded = keras.layers.Dense(dim, name="embedding")(pooled)
        logits = HypersphericalPrototypes(num_classes, dim, name="hyperspherical_head", **head_kwargs)(embedded)
    return TaskModel(inputs, logits, name=name or f"{extractor.name}_{head}", task="classification")


def hyperspherical_training_model(model, name=None):
    """The training model of a hyperspherical classifier: inputs ``[images, labels]`` (labels int ``(B,)``), the
    same logits, the same layers and weights as ``model``.

    The labels reach ``HypersphericalPrototypes`` in training calls, which keeps the class representatives that
    ``callbacks.PrototypeReassignment`` reads (Saadabadi et al. 2024, Sec. 3.2.3); the logits do not depend on them.
    Usage::

        model = zoo.image_classifier("small_convnet", "hyperspherical", 10, head_kwargs={"dim": 8})
        train = zoo.hyperspherical_training_model(model)
        train.compile("adam", ot_layers.losses.HypersphericalPullLoss())
        train.fit([x, y], y, callbacks=[ot_layers.callbacks.PrototypeReassignment()])
        model.predict(x)  # served: images only

    ``model``: a classifier from :func:`image_classifier` with ``head="hyperspherical"`` (or one loaded from
    ``.keras``). :func:`hyperspherical_inference_model` goes back from a (loaded) training model.
    """
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a keras.Model (a hyperspherical classifier), got "
                         f"{type(model).__name__}.")
    if len(model.inputs) != 1:
        raise ValueError(f"`model` must be the served classifier (input images only); {model.name!r} has "
                         f"{len(model.inputs)} inputs (a training model already?).")
    try:
        head = find_layer(model, HypersphericalPrototypes)
        features = model.get_layer("embedding").output
    except ValueError as error:
        raise ValueError(f"`model` must be a classifier built with head='hyperspherical' (one "
                         f"HypersphericalPrototypes layer fed by the 'embedding' layer): {error}") from None
    labels = keras.Input((), dtype="int32", name="labels")
    return keras.Model([model.inputs[0], labels], head(features, labels=labels),
                       name=name or f"{model.name}_training")


def hyperspherical_inference_model(train, name=None):
    """The served classifier (input ``images`` only) of a hyperspherical training model from
    :func:`hyperspherical_training_model`, e.g. one loaded from ``.keras``: the same layers and weights."""
    if not isinstance(train, keras.Model) or len(train.inputs) != 2:
        raise ValueError("`train` must be a hyperspherical training model (inputs [images, labels]), got "
                         f"{train!r}.")
    try:
        head = find_layer(train, HypersphericalPrototypes)
        features = train.get_layer("embedding").output
    except ValueError as error:
        raise ValueError(f"`train` must be a hyperspherical training model: {error}") from None
    return TaskModel(train.inputs[0], head(features), name=name or train.name.removesuffix("_training"),
                     task="classification")
