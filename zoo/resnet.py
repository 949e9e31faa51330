"""CIFAR-style ResNets (He et al. 2016, Sec. 4.2): ResNet-20/32/56 feature extractors.

``depth = 6 n + 2``: a 3x3 stem convolution with ``widths[0]`` channels, then three stages of ``n`` basic blocks
(two 3x3 conv-BN layers, ReLU after the sum) with ``widths = (16, 32, 64)`` channels; the second and third stages
halve the resolution in their first block, whose shortcut is a strided 1x1 conv-BN projection (the paper's option B;
identity shortcuts elsewhere). A 28x28 input gives a 7x7x64 feature map, a 32x32 input 8x8x64. No pooling or
classifier: the heads of ``ot_layers`` take the feature map.
"""
import keras
import numpy as np
from keras import layers

from ot_layers.validation import check_in_range, check_non_negative, check_positive_int
from zoo.inputs import check_input_shape

WIDTHS = (16, 32, 64)
DEPTHS = (20, 32, 56, 110)


def _conv(filters, strides, name, l2):
    regularizer = keras.regularizers.L2(l2) if l2 else None
    return layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False,
                         kernel_initializer="he_normal", kernel_regularizer=regularizer, name=name)


def _basic_block(x, filters, strides, name, l2, bn_momentum):
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        regularizer = keras.regularizers.L2(l2) if l2 else None
        shortcut = layers.Conv2D(filters, 1, strides=strides, use_bias=False, kernel_initializer="he_normal",
                                 kernel_regularizer=regularizer, name=f"{name}_shortcut_conv")(x)
        shortcut = layers.BatchNormalization(momentum=bn_momentum, name=f"{name}_shortcut_bn")(shortcut)
    y = _conv(filters, strides, f"{name}_conv1", l2)(x)
    y = layers.BatchNormalization(momentum=bn_momentum, name=f"{name}_bn1")(y)
    y = layers.ReLU(name=f"{name}_relu1")(y)
    y = _conv(filters, 1, f"{name}_conv2", l2)(y)
    y = layers.BatchNormalization(momentum=bn_momentum, name=f"{name}_bn2")(y)
    return layers.ReLU(name=f"{name}_out")(layers.Add(name=f"{name}_add")([y, shortcut]))


def cifar_resnet(depth=20, input_shape=(32, 32, 3), widths=WIDTHS, l2=0.0, bn_momentum=0.9, name=None):
    """A CIFAR-style ResNet of ``depth`` layers (``6 n + 2``) returning its last feature map
    ``(B, H/4, W/4, widths[-1])`` (64 channels by default).

    ``input_shape`` may leave the spatial size open (``(None, None, C)``); ``l2`` adds an L2 penalty
    ``l2 * ||w||^2`` on every convolution kernel; ``bn_momentum`` is BatchNorm's moving-average momentum.
    """
    depth = check_positive_int("depth", depth)
    if depth < 8 or (depth - 2) % 6:
        raise ValueError(f"`depth` must be 6 n + 2 with n >= 1 (20, 32, 56, 110, ...), got {depth!r}.")
    if not isinstance(widths, (list, tuple, np.ndarray)) or len(widths) != 3:
        raise ValueError(f"`widths` must be a list or tuple of 3 entries (one per stage), got {widths!r}.")
    for width in widths:
        check_positive_int("widths", width)
    check_non_negative("l2", l2)
    check_in_range("bn_momentum", bn_momentum, 0.0, 1.0)
    input_shape = check_input_shape(input_shape)
    blocks = (depth - 2) // 6
    inputs = keras.Input(shape=input_shape, name="images")
    x = _conv(widths[0], 1, "stem_conv", l2)(inputs)
    x = layers.BatchNormalization(momentum=bn_momentum, name="stem_bn")(x)
    x = layers.ReLU(name="stem_relu")(x)
    for stage, filters in enumerate(widths):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, filters, strides, f"stage{stage + 1}_block{block + 1}", l2, bn_momentum)
    return keras.Model(inputs, x, name=name or f"resnet{depth}")


def resnet20(input_shape=(32, 32, 3), **kwargs):
    """ResNet-20 (n = 3, 0.27 M parameters): :func:`cifar_resnet` with ``depth=20``."""
    return cifar_resnet(20, input_shape, **kwargs)


def resnet32(input_shape=(32, 32, 3), **kwargs):
    """ResNet-32 (n = 5): :func:`cifar_resnet` with ``depth=32``."""
    return cifar_resnet(32, input_shape, **kwargs)


def resnet56(input_shape=(32, 32, 3), **kwargs):
    """ResNet-56 (n = 9): :func:`cifar_resnet` with ``depth=56``."""
    return cifar_resnet(56, input_shape, **kwargs)
