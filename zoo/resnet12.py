"""ResNet-12, the few-shot backbone of DeepEMD and ProtoNet follow-ups (Zhang et al. 2022, Sec. 5).

Four residual blocks; each is three 3x3 conv-BN-LeakyReLU(0.1) layers (the last without its activation before the
sum), a 1x1 conv-BN shortcut, LeakyReLU after the sum, then 2x2 max pooling. The standard widths are
(64, 160, 320, 640): 84x84 input -> 5x5x640 feature map (Zhang et al. 2022, Sec. 5.1, state 5x5x512 for their
ResNet-12; 640 channels are the common ResNet-12's). ``pool`` chooses the blocks that downsample, so small
inputs keep a usable map (28x28 with ``pool=(True, True, False, False)`` -> 7x7).

Each downsampling block halves the map (rounding down), so ``k`` of them need images of at least ``2**k`` pixels a
side (16 for all four). A fixed ``input_shape`` is checked when the network is built; with an open one (``None``
sizes) the first downsampling block's pooling, a :class:`MinSizeMaxPooling2D`, checks the images it gets. Left to
Keras' ``MaxPooling2D``, smaller images gave an empty feature map without a word (TensorFlow eagerly, JAX) or an
error of the last pooling about a negative or too small output size (TensorFlow's ``predict``, PyTorch).
"""
import keras
import numpy as np
from keras import layers

from ot_layers.validation import check_positive_int
from zoo.inputs import check_input_shape

WIDTHS = (64, 160, 320, 640)


@keras.saving.register_keras_serializable(package="zoo")
class MinSizeMaxPooling2D(layers.MaxPooling2D):
    """``MaxPooling2D`` that first checks its input is at least ``min_size`` pixels a side: the pooling of the first
    downsampling block of a ResNet-12 built for an open input size, whose input has the images' size (the
    convolutions before it keep it), ``min_size`` ``2**k`` for the network's ``k`` downsampling blocks. Smaller
    images raise one ``ValueError`` naming their size and the limit (inside Keras' report of the failed call), where
    the size is known: eagerly and in ``predict``, ``fit`` and ``evaluate`` on JAX and PyTorch, on TensorFlow eagerly
    and in the first size a ``predict``/``fit``/``evaluate`` function is traced for, and when a model is built on a
    fixed-size input. Not in a TensorFlow graph traced for any size (Keras traces its functions again for any size
    once a second size comes; an exported SavedModel), where smaller images still give an empty feature map."""

    def __init__(self, pool_size=2, min_size=1, **kwargs):
        super().__init__(pool_size=pool_size, **kwargs)
        self.min_size = check_positive_int("min_size", min_size)

    def _check_size(self, shape):
        sides = tuple(shape)[1:3] if self.data_format == "channels_last" else tuple(shape)[2:4]
        known = [isinstance(side, int) for side in sides]  # None, or a JAX symbolic size: not known
        if any(k and side < self.min_size for k, side in zip(known, sides)):
            size = "x".join(str(side) if k else "?" for k, side in zip(known, sides))
            raise ValueError(f"ResNet-12 downsamples {self.min_size.bit_length() - 1} times and takes images of at "
                             f"least {self.min_size}x{self.min_size} pixels, got {size}; upsample the images, or "
                             "build it for their size (zoo.backbone('resnet12', (height, width, channels)) pools "
                             "less).")

    def call(self, inputs):
        self._check_size(inputs.shape)
        return super().call(inputs)

    def compute_output_shape(self, input_shape):
        self._check_size(input_shape)
        return super().compute_output_shape(input_shape)

    def get_config(self):
        return dict(super().get_config(), min_size=self.min_size)


def _block(x, filters, pool, name, min_size=None):
    shortcut = layers.Conv2D(filters, 1, use_bias=False, name=f"{name}_shortcut_conv")(x)
    shortcut = layers.BatchNormalization(name=f"{name}_shortcut_bn")(shortcut)
    for i in range(3):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv{i}")(x)
        x = layers.BatchNormalization(name=f"{name}_bn{i}")(x)
        if i < 2:
            x = layers.LeakyReLU(0.1, name=f"{name}_relu{i}")(x)
    x = layers.LeakyReLU(0.1, name=f"{name}_out")(layers.Add(name=f"{name}_add")([x, shortcut]))
    if not pool:
        return x
    if min_size is not None:  # an open input size: the images are checked as they come
        return MinSizeMaxPooling2D(2, min_size=min_size, name=f"{name}_pool")(x)
    return layers.MaxPooling2D(2, name=f"{name}_pool")(x)


def resnet12(input_shape=(84, 84, 3), widths=WIDTHS, pool=(True, True, True, True), name="resnet12"):
    """A ResNet-12 feature extractor returning the last block's feature map ``(B, H, W, widths[-1])``.

    ``pool``: which of the four blocks end in 2x2 max pooling (each halves the map, rounding down), so the images
    must be at least ``2**k`` pixels a side for ``k`` of them (16 for the default four). A fixed ``input_shape`` that
    is smaller raises ``ValueError`` here; with an open size (``None``), the first downsampling block's pooling is a
    :class:`MinSizeMaxPooling2D`, which raises ``ValueError`` naming the images' size and the limit when the model
    is called on smaller ones (where the size is known as it runs: see that class)."""
    for argument, value in (("widths", widths), ("pool", pool)):
        if not isinstance(value, (list, tuple, np.ndarray)) or len(value) != 4:
            raise ValueError(f"`{argument}` must be a list or tuple of 4 entries (one per block), got {value!r}.")
    for width in widths:
        check_positive_int("widths", width)
    input_shape = check_input_shape(input_shape)
    known = [d for d in input_shape[:2] if d is not None]
    halvings = sum(bool(p) for p in pool)
    if known and min(known) >> halvings < 1:  # MaxPooling2D failed on an empty map, in Keras' words
        raise ValueError(f"`pool` downsamples {halvings} times, more than the {min(known)}-pixel side of "
                         f"`input_shape` {input_shape} allows ({min(known).bit_length() - 1} at most); pass fewer "
                         "True entries, or zoo.backbones.resnet12_pooling(input_shape).")
    # An open side is checked on the images, by the first block that downsamples (the convolutions before it keep
    # the image's size); a fixed size was checked above, and its model is made of Keras' layers only.
    check_first = halvings and any(d is None for d in input_shape[:2])
    inputs = keras.Input(shape=input_shape, name="images")
    x = inputs
    for i, (width, downsample) in enumerate(zip(widths, pool)):
        x = _block(x, width, bool(downsample), f"block{i + 1}", min_size=2 ** halvings if check_first else None)
        check_first = check_first and not downsample
    return keras.Model(inputs, x, name=name)
