"""ResNet-12, the few-shot backbone of DeepEMD and ProtoNet follow-ups (Zhang et al. 2022, Sec. 5).

Four residual blocks; each is three 3x3 conv-BN-LeakyReLU(0.1) layers (the last without its activation before the
sum), a 1x1 conv-BN shortcut, LeakyReLU after the sum, then 2x2 max pooling. The standard widths are
(64, 160, 320, 640): 84x84 input -> 5x5x640 feature map (Zhang et al. 2022, Sec. 5.1, state 5x5x512 for their
ResNet-12; 640 channels are the common ResNet-12's). ``pool`` chooses the blocks that downsample, so small
inputs keep a usable map (28x28 with ``pool=(True, True, False, False)`` -> 7x7).
"""
import keras
import numpy as np
from keras import layers

from ot_layers.validation import check_positive_int
from zoo.inputs import check_input_shape

WIDTHS = (64, 160, 320, 640)


def _block(x, filters, pool, name):
    shortcut = layers.Conv2D(filters, 1, use_bias=False, name=f"{name}_shortcut_conv")(x)
    shortcut = layers.BatchNormalization(name=f"{name}_shortcut_bn")(shortcut)
    for i in range(3):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv{i}")(x)
        x = layers.BatchNormalization(name=f"{name}_bn{i}")(x)
        if i < 2:
            x = layers.LeakyReLU(0.1, name=f"{name}_relu{i}")(x)
    x = layers.LeakyReLU(0.1, name=f"{name}_out")(layers.Add(name=f"{name}_add")([x, shortcut]))
    return layers.MaxPooling2D(2, name=f"{name}_pool")(x) if pool else x


def resnet12(input_shape=(84, 84, 3), widths=WIDTHS, pool=(True, True, True, True), name="resnet12"):
    """A ResNet-12 feature extractor returning the last block's feature map ``(B, H, W, widths[-1])``."""
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
    inputs = keras.Input(shape=input_shape, name="images")
    x = inputs
    for i, (width, downsample) in enumerate(zip(widths, pool)):
        x = _block(x, width, bool(downsample), f"block{i + 1}")
    return keras.Model(inputs, x, name=name)
