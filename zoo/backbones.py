"""Backbones that return a feature map ``(B, H, W, C)`` for the heads and pooling layers of ``ot_layers``."""
import keras
from keras import layers


def small_convnet(input_shape=(28, 28, 1), width=32, feature_dim=64, bn_momentum=0.99,
                  name="small_convnet"):
    """A 4-conv network (conv-BN-ReLU, two 2x poolings): 28x28 input -> 7x7 feature map of ``feature_dim``.

    ``bn_momentum``: BatchNorm's moving-statistics momentum; 0.9 suits short trainings (a few hundred steps), whose
    moving statistics would otherwise still be far from the data's.
    """
    inputs = keras.Input(shape=input_shape, name="images")
    x = inputs
    for i, (filters, pool) in enumerate(((width, False), (width, True), (2 * width, False), (feature_dim, True))):
        x = layers.Conv2D(filters, 3, padding="same", use_bias=False, name=f"conv{i}")(x)
        x = layers.BatchNormalization(momentum=bn_momentum, name=f"bn{i}")(x)
        x = layers.ReLU(name=f"relu{i}")(x)
        if pool:
            x = layers.MaxPooling2D(2, name=f"pool{i}")(x)
    return keras.Model(inputs, x, name=name)
