"""What the experiments pass to the zoo's model builders so that a zoo-built model is the experiment's own model.

The experiments' networks had no preprocessing: the first convolution saw the loaded arrays as they are (0-255 or
[0, 1] values, whichever the script loads), and docs/results/*.md report the numbers of those networks. A zoo model
normalizes pixels in its ``preprocess`` Rescaling layer, ``x / (255 std) - mean / std``; with ``RAW_PIXELS``
(mean 0, std 1/255) that layer is the identity (scale exactly 1.0, offset 0.0), so the zoo builders give the
experiments' networks, their weights drawn in the same order from the same seed.
"""
RAW_PIXELS = {"pixel_mean": 0.0, "pixel_std": 1.0 / 255.0}
INPUT_SHAPE = (28, 28, 1)


def small_convnet_options(width, feature_dim=None, bn_momentum=0.9):
    """Keyword arguments of a zoo builder (``zoo.image_classifier``, ``zoo.embedding_model``) for the backbone
    ``"small_convnet"`` on 28x28x1 images with ``RAW_PIXELS``: ``width`` filters, ``feature_dim`` output channels
    (default ``2 * width``), BatchNorm momentum ``bn_momentum`` (0.9: the experiments' short runs)."""
    feature_dim = 2 * width if feature_dim is None else feature_dim
    return dict(input_shape=INPUT_SHAPE, backbone_kwargs=dict(width=width, feature_dim=feature_dim,
                                                              bn_momentum=bn_momentum), **RAW_PIXELS)
