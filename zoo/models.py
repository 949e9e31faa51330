"""Models assembled from a backbone's feature map and a head, with pixel preprocessing inside the model.

A zoo model takes raw pixel values (uint8 or float in 0-255) and normalizes them itself, so a served model needs no
client-side code: ``x -> (x / 255 - mean) / std`` is one ``Rescaling`` layer named ``preprocess``.
"""
import keras

from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.validation import check_choice, check_positive, check_positive_int

CLASSIFICATION_HEADS = ("gap_fc", "mpw")


def pixel_preprocessing(mean, std, name="preprocess"):
    """``Rescaling`` that maps 0-255 pixels to ``(x / 255 - mean) / std`` (``mean``/``std`` in [0, 1] units)."""
    std = check_positive("std", std)
    return keras.layers.Rescaling(scale=1.0 / (255.0 * std), offset=-float(mean) / std, name=name)


def image_classifier(backbone, head="gap_fc", num_classes=10, pixel_mean=0.5, pixel_std=0.25, head_kwargs=None,
                     name=None):
    """``images (0-255) -> preprocess -> backbone feature map -> head -> logits (B, num_classes)``.

    ``backbone``: a Keras model from images to a feature map ``(B, H, W, C)`` (its input shape is the model's).
    ``head``: ``"gap_fc"`` (global average pooling + Dense, the usual baseline) or ``"mpw"``
    (``ot_layers.MultiProxyWasserstein`` on the whole feature map); ``head_kwargs`` go to the head layer.
    """
    check_choice("head", head, CLASSIFICATION_HEADS)
    num_classes = check_positive_int("num_classes", num_classes)
    head_kwargs = dict(head_kwargs or {})
    inputs = keras.Input(backbone.inputs[0].shape[1:], name="images")
    features = backbone(pixel_preprocessing(pixel_mean, pixel_std)(inputs))
    if head == "mpw":
        logits = MultiProxyWasserstein(num_classes, name="mpw_head", **head_kwargs)(features)
    else:
        pooled = keras.layers.GlobalAveragePooling2D(name="gap")(features)
        logits = keras.layers.Dense(num_classes, name="dense_head", **head_kwargs)(pooled)
    return keras.Model(inputs, logits, name=name or f"{backbone.name}_{head}")
