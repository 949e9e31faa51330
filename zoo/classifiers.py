"""Image classifiers assembled from a backbone's feature map and a head."""
import keras

from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from zoo.backbones import small_convnet

HEADS = ("mpw", "gap")


def build_classifier(head="mpw", num_classes=10, input_shape=(28, 28, 1), width=32, feature_dim=64,
                     num_proxies=4, bn_momentum=0.9, name=None, **head_kwargs):
    """``small_convnet`` + a head: ``"mpw"`` (MultiProxyWasserstein on the feature map) or ``"gap"`` (global
    average pooling + Dense, the usual baseline). Returns an uncompiled model emitting logits."""
    if head not in HEADS:
        raise ValueError(f"`head` must be one of {list(HEADS)}, got {head!r}.")
    backbone = small_convnet(input_shape, width=width, feature_dim=feature_dim, bn_momentum=bn_momentum)
    inputs = keras.Input(input_shape, name="images")
    features = backbone(inputs)
    if head == "mpw":
        logits = MultiProxyWasserstein(num_classes, num_proxies=num_proxies, name="mpw_head", **head_kwargs)(features)
    else:
        pooled = keras.layers.GlobalAveragePooling2D(name="gap")(features)
        logits = keras.layers.Dense(num_classes, name="dense_head")(pooled)
    return keras.Model(inputs, logits, name=name or f"convnet_{head}")
