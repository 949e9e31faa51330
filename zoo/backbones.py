"""Backbones that return a feature map ``(B, H, W, C)`` for the heads and pooling layers of ``ot_layers``.

:func:`backbone` is the single entry point: a name (``BACKBONES``), a user's Keras model or a ``keras.applications``
model built with ``include_top=False`` (and ``pooling=None``), checked to output a rank-4 feature map.
"""

import inspect

import keras
from keras import layers

from ot_layers.validation import check_in_range, check_positive_int
from zoo.inputs import check_input_shape
from zoo.resnet import cifar_resnet, resnet20, resnet32, resnet56
from zoo.resnet12 import resnet12


def small_convnet(input_shape=(28, 28, 1), width=32, feature_dim=64, bn_momentum=0.99,
                  name="small_convnet"):
    """A 4-conv network (conv-BN-ReLU, two 2x poolings): 28x28 input -> 7x7 feature map of ``feature_dim``.

    ``bn_momentum``: BatchNorm's moving-statistics momentum; 0.9 suits short trainings (a few hundred steps), whose
    moving statistics would otherwise still be far from the data's.
    """
    width, feature_dim = check_positive_int("width", width), check_positive_int("feature_dim", feature_dim)
    check_in_range("bn_momentum", bn_momentum, 0.0, 1.0)
    input_shape = check_input_shape(input_shape)
    if any(d is not None and d < 4 for d in input_shape[:2]):
        raise ValueError(f"`input_shape` of small_convnet needs height and width >= 4 (two 2x poolings), got "
                         f"{input_shape!r}.")
    inputs = keras.Input(shape=input_shape, name="images")
    x = inputs
    for i, (filters, pool) in enumerate(((width, False), (width, True), (2 * width, False), (feature_dim, True))):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"conv{i}")(x)
        x = layers.BatchNormalization(momentum=bn_momentum, name=f"bn{i}")(x)
        x = layers.ReLU(name=f"relu{i}")(x)
        if pool:
            x = layers.MaxPooling2D(2, name=f"pool{i}")(x)
    return keras.Model(inputs, x, name=name)


def resnet12_pooling(input_shape, min_size=5):
    """Which of ResNet-12's four blocks downsample so the feature map stays at least ``min_size`` pixels a side:
    84x84 -> all four (5x5, the standard), 32x32 -> two (8x8), 28x28 -> two (7x7); an open size -> all four (which
    take images of at least 16x16 pixels: smaller ones raise ``ValueError`` as the model is called)."""
    size = None if input_shape[0] is None or input_shape[1] is None else min(input_shape[:2])
    pool = []
    for _ in range(4):
        downsample = size is None or size // 2 >= min_size
        pool.append(downsample)
        if downsample and size is not None:
            size //= 2
    return tuple(pool)


def _builders():

    def _resnet12(input_shape=(84, 84, 3), **kwargs):
        kwargs.setdefault("pool", resnet12_pooling(check_input_shape(input_shape)))
        return resnet12(input_shape, **kwargs)

    return {"resnet20": resnet20, "resnet32": resnet32, "resnet56": resnet56, "resnet12": _resnet12,
            "small_convnet": small_convnet}


BACKBONES = ("resnet20", "resnet32", "resnet56", "resnet12", "small_convnet")
DEFAULT_INPUT_SHAPES = {"resnet20": (32, 32, 3), "resnet32": (32, 32, 3), "resnet56": (32, 32, 3),
                        "resnet12": (84, 84, 3), "small_convnet": (28, 28, 1)}


def _output_shape(model, input_shape):
    outputs = getattr(model, "outputs", None)
    if outputs:
        if len(outputs) != 1:
            raise ValueError(f"`backbone` must have a single output (a feature map), {model.name!r} has "
                             f"{len(outputs)}.")
        return tuple(outputs[0].shape)
    if input_shape is None:
        raise ValueError(f"`backbone` {model.name!r} is not built: pass `input_shape` so its output can be checked.")
    return tuple(model.compute_output_shape((None,) + tuple(input_shape)))


# The function whose arguments each backbone's builder passes on (ResNet-20/32/56 wrap cifar_resnet).
_OPTION_SOURCES = {"resnet20": cifar_resnet, "resnet32": cifar_resnet, "resnet56": cifar_resnet,
                   "resnet12": resnet12, "small_convnet": small_convnet}


def builder_options(name):
    """The keyword arguments :func:`backbone` passes to the builder of backbone ``name`` (a key of ``BACKBONES``):
    the builder's own arguments less ``input_shape`` (and the CIFAR-style ResNets' ``depth``, which their name
    fixes)."""
    return [parameter for parameter in inspect.signature(_OPTION_SOURCES[name]).parameters
            if parameter not in ("input_shape", "depth")]


def backbone(spec, input_shape=None, **kwargs):
    """A feature extractor returning a feature map ``(B, H, W, C)``.

    ``spec``: a name in ``BACKBONES`` ("resnet20", "resnet32", "resnet56": CIFAR-style ResNets, He et al. 2016,
    Sec. 4.2; "resnet12": the few-shot ResNet-12; "small_convnet"), built for ``input_shape`` (``(H, W, C)``, sizes
    may be ``None``; default: the network's usual input) with ``kwargs`` passed to its builder. For "resnet12" the
    blocks that downsample default to :func:`resnet12_pooling` (the map stays >= 5x5: 84 -> 5x5, 32 -> 8x8,
    28 -> 7x7; an open size: all four, for images of 16x16 pixels or more); pass ``pool=`` to choose them.

    Or a Keras model, e.g. the user's own or ``keras.applications.MobileNetV2(include_top=False, weights=None,
    input_shape=(32, 32, 3))``: returned as is after checking that it outputs a rank-4 feature map (a model with
    its classifier top or global pooling is refused) and, when ``input_shape`` is given, that its input accepts it.
    """
    if isinstance(spec, str):
        key = spec.lower()
        if key not in BACKBONES:
            raise ValueError(f"`backbone` must be one of {list(BACKBONES)} or a Keras model returning a feature map "
                             f"(B, H, W, C), got {spec!r}.")
        input_shape = DEFAULT_INPUT_SHAPES[key] if input_shape is None else check_input_shape(input_shape)
        options = builder_options(key)
        for option in kwargs:
            if option not in options:
                fixed = " (its name fixes the depth: resnet20, resnet32 or resnet56)" if option == "depth" else ""
                raise ValueError(f"`{option}` is not a builder option of backbone {key!r}{fixed}, which takes "
                                 f"{', '.join(options)} (and `input_shape`).")
        return _builders()[key](input_shape=input_shape, **kwargs)
    if not isinstance(spec, keras.Model):
        raise ValueError(f"`backbone` must be one of {list(BACKBONES)} or a keras.Model returning a feature map "
                         f"(B, H, W, C), got an object of type {type(spec).__name__}.")
    if kwargs:
        raise ValueError(f"Builder options {sorted(kwargs)} apply to named backbones only, not to the Keras model "
                         f"{spec.name!r} given as `backbone`.")
    if input_shape is not None:
        input_shape = check_input_shape(input_shape)
        model_inputs = getattr(spec, "inputs", None)
        if model_inputs:
            expected = tuple(model_inputs[0].shape)[1:]
            if len(model_inputs) != 1 or len(expected) != 3 or any(
                    a is not None and b is not None and a != b for a, b in zip(expected, input_shape)):
                raise ValueError(f"`input_shape` {input_shape} does not fit the input {expected} of the `backbone` "
                                 f"model {spec.name!r}.")
    shape = _output_shape(spec, input_shape)
    if len(shape) != 4:
        raise ValueError(
            f"`backbone` must output a feature map (B, H, W, C); {spec.name!r} outputs shape {shape}. Remove its "
            "classifier top and global pooling (keras.applications: include_top=False, pooling=None)."
        )
    return spec
