"""Translated and cluttered images: each image placed at a random position on a larger blank canvas, with small
crops of other images of the same set scattered over the canvas (the cluttered translated MNIST of Mnih et al.
2014, Sec. 4.1, there 60x60 canvases with four 8x8 pieces of clutter).

The clutter holds the same kind of strokes and textures as the objects themselves, so a model cannot tell it apart
by its pixel statistics; it has to find the object. Data for asking whether a selective pooling (Generalized Sum
Pooling) helps where a feature map has positions worth dropping.
"""
from dataclasses import dataclass

import numpy as np

from ot_layers.validation import check_image_array, check_non_negative_int, check_positive_int, check_seed


@dataclass(frozen=True)
class ClutteredImages:
    """``images`` ``(N, canvas_size, canvas_size, C)`` and, per image, the ``(row, column)`` of its object's top-left
    corner on the canvas (``offsets``, ``(N, 2)`` int) and the object's ``(height, width)`` (``object_size``)."""
    images: np.ndarray
    offsets: np.ndarray
    object_size: tuple


def clutter(images, canvas_size, pieces=4, piece_size=8, seed=0):
    """``ClutteredImages`` of ``images`` ``(N, H, W, C)``.

    Each image is copied to a uniformly random position of a ``canvas_size`` x ``canvas_size`` canvas of zeros
    (the background of Fashion-MNIST and MNIST); then ``pieces`` crops of ``piece_size`` x ``piece_size`` pixels,
    each from a uniformly random position of another image of ``images`` (never the image itself), are laid at
    uniformly random positions of the canvas, combined with what is there by the pixel-wise maximum (so no piece
    erases the object's ink; a piece may cover the object's background). ``piece_size`` must fit the images when
    there are pieces. ``seed`` fixes every draw: the same arguments give the same canvases.
    """
    images = check_image_array("images", images)
    if images.ndim != 4:
        raise ValueError(f"`images` must be a batch of images (N, height, width, channels), got shape "
                         f"{images.shape}.")
    count, height, width, channels = images.shape
    canvas_size = check_positive_int("canvas_size", canvas_size)
    if canvas_size < max(height, width):
        raise ValueError(f"`canvas_size` must be at least the images' size {max(height, width)}, got {canvas_size}.")
    pieces, piece_size = check_non_negative_int("pieces", pieces), check_positive_int("piece_size", piece_size)
    if pieces and piece_size > min(height, width):
        raise ValueError(f"`piece_size` must be at most the images' smaller side {min(height, width)}, got "
                         f"{piece_size}.")
    if pieces and count < 2:
        raise ValueError(f"`images` must hold at least 2 images to cut clutter from other images, got {count}.")
    rng = np.random.default_rng(check_seed("seed", seed))
    offsets = np.stack([rng.integers(0, canvas_size - height + 1, count),
                        rng.integers(0, canvas_size - width + 1, count)], axis=1)
    # each piece: its source image (another one: a shift of 1..N-1), its crop corner and its canvas corner
    sources = (np.arange(count)[:, None] + rng.integers(1, max(count, 2), (count, pieces))) % count
    crops = rng.integers(0, [height - piece_size + 1, width - piece_size + 1], (count, pieces, 2))
    places = rng.integers(0, canvas_size - piece_size + 1, (count, pieces, 2))
    canvases = np.zeros((count, canvas_size, canvas_size, channels), dtype=images.dtype)
    for i in range(count):
        row, column = offsets[i]
        canvases[i, row:row + height, column:column + width] = images[i]
        for source, (crop_row, crop_column), (place_row, place_column) in zip(sources[i], crops[i], places[i]):
            piece = images[source, crop_row:crop_row + piece_size, crop_column:crop_column + piece_size]
            target = canvases[i, place_row:place_row + piece_size, place_column:place_column + piece_size]
            np.maximum(target, piece, out=target)
    return ClutteredImages(canvases, offsets, (height, width))
