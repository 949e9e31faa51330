"""Images in and out of a model's input format: reading files, fitting arrays to the input, upsampling maps.

Zoo models take raw 0-255 pixels, so everything here keeps that range (float32): a picture drawn under a heat map
is the very array the model saw.
"""
import os

import keras
import numpy as np

from ot_layers.optional import require


def _bilinear_resize(images, size, antialias=False):
    """``images`` ``(B, H, W, C)`` resized bilinearly to ``size`` as NumPy, on every backend (``keras.ops``;
    ``tf.image.resize``'s half-pixel centres)."""
    resized = keras.ops.image.resize(images, size, interpolation="bilinear", antialias=antialias,
                                     data_format="channels_last")
    return keras.ops.convert_to_numpy(resized)


def model_input_shape(model):
    """``(H, W, C)`` of ``model``'s (first) image input; ``H``/``W`` may be ``None`` (any size)."""
    shape = tuple(model.inputs[0].shape[1:])
    if len(shape) != 3 or shape[-1] is None:
        raise ValueError(f"`model` must take images (B, H, W, C) with a known channel count, its first input has "
                         f"shape {model.inputs[0].shape}.")
    return shape


def prepare_images(images, input_shape):
    """``images`` as a float32 batch ``(B, H, W, C)`` of 0-255 pixels fitting ``input_shape`` ``(H, W, C)``.

    Accepts one image ``(h, w)`` / ``(h, w, c)`` or a batch ``(B, h, w, c)``, any numeric dtype (uint8 or float
    0-255). A different size is resized bilinearly (a ``None`` size in ``input_shape`` keeps the image's); one
    channel is repeated to three, three are turned into one by ITU-R 601 luma (``keras.utils.load_img``'s
    grayscale conversion).
    """
    array = np.asarray(images, dtype=np.float32)
    if array.ndim == 2:
        array = array[None, ..., None]
    elif array.ndim == 3:
        array = array[None]
    if array.ndim != 4 or array.shape[-1] not in (1, 3, 4) or 0 in array.shape:
        raise ValueError(f"`images` must be an image (H, W), (H, W, C) or a batch (B, H, W, C) with C in 1, 3, 4, "
                         f"got shape {np.shape(images)}.")
    if not np.all(np.isfinite(array)):
        raise ValueError("`images` hold NaN or Inf.")
    height, width, channels = input_shape
    array = array[..., :3]  # drop alpha
    if array.shape[-1] != channels:
        if channels == 1:
            array = array @ np.array([[0.299], [0.587], [0.114]], dtype=np.float32)
        elif channels == 3:
            array = np.repeat(array, 3, axis=-1)
        else:
            raise ValueError(f"`input_shape` must have 1 or 3 channels to convert images, got {input_shape!r}.")
    size = (height or array.shape[1], width or array.shape[2])
    if size != tuple(array.shape[1:3]):
        array = np.clip(_bilinear_resize(array, size, antialias=True), 0.0, 255.0)
    return array.astype(np.float32)


def load_image_file(path, input_shape):
    """A PNG/JPEG (any format ``keras.utils.load_img`` reads) as ``(H, W, C)`` float32 0-255 fitting
    ``input_shape``; a missing file raises ``FileNotFoundError`` naming it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"IMAGE: no image file at {path!r}.")
    height, width, channels = input_shape
    target = None if height is None or width is None else (height, width)
    require("PIL.Image", "explain", "reading image files")  # what keras.utils.load_img reads with
    try:
        image = keras.utils.load_img(path, color_mode="grayscale" if channels == 1 else "rgb", target_size=target,
                                     interpolation="bilinear")
    except Exception as error:  # PIL raises its own UnidentifiedImageError / OSError
        raise ValueError(f"IMAGE: cannot read {path!r} as an image ({type(error).__name__}: {error}).") from None
    return prepare_images(keras.utils.img_to_array(image), input_shape)[0]


def upsample(maps, size):
    """Bilinear upsampling of cell maps ``(..., h, w)`` to ``size`` ``(H, W)`` (pixel centres aligned as
    ``tf.image.resize`` does), for heat maps drawn over the image; float32."""
    maps = np.asarray(maps, dtype=np.float32)
    lead = maps.shape[:-2]
    flat = maps.reshape((-1,) + maps.shape[-2:] + (1,))
    resized = _bilinear_resize(flat, size)[..., 0]
    return resized.reshape(lead + tuple(size))
