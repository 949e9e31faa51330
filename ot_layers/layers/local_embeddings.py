"""PatchExtractor: the image patches behind DeepEMD's Grid and Sampling local embeddings (Zhang et al. 2022, Sec.
4.2)."""
import keras
from keras import ops

from ot_layers.layers.base import ExportableLayer
from ot_layers.validation import check_choice, check_in_range, check_positive_int, check_rank

MODES = ("grid", "sampling")


def _sample_points(start, end, size, crop):
    """``tf.image.crop_and_resize``'s sampling positions along one axis: ``crop`` points from ``start`` to ``end``
    (normalized box edges ``(count,)``) on an axis of ``size`` pixels, ``(count, crop)`` float32, and whether each
    lies inside the image."""
    last = ops.cast(size - 1, "float32")
    if crop > 1:
        steps = ops.arange(crop, dtype="float32")
        scale = (end - start) * last / float(crop - 1)
        position = start[:, None] * last + steps[None, :] * scale[:, None]
    else:
        position = (0.5 * (start + end) * last)[:, None]
    inside = ops.logical_and(position >= 0.0, position <= last)
    return position, inside


def crop_and_resize(images, boxes, image_index, crop_size):
    """``tf.image.crop_and_resize`` (bilinear, extrapolation value 0) in ``keras.ops``: crops ``(count, crop_size,
    crop_size, C)`` of ``images`` ``(B, H, W, C)`` (float32) at the normalized boxes ``(count, 4)``
    ``[y1, x1, y2, x2]`` of the images ``image_index`` ``(count,)``, sampled on the same grid as TensorFlow's kernel:
    ``y = y1 (H - 1) + i (y2 - y1) (H - 1) / (crop_size - 1)`` (the box centre for ``crop_size = 1``)."""
    shape = ops.shape(images)
    height, width, channels = shape[1], shape[2], images.shape[-1]
    in_y, inside_y = _sample_points(boxes[:, 0], boxes[:, 2], height, crop_size)
    in_x, inside_x = _sample_points(boxes[:, 1], boxes[:, 3], width, crop_size)
    top, left = ops.floor(in_y), ops.floor(in_x)
    y_lerp, x_lerp = (in_y - top)[:, :, None, None], (in_x - left)[:, None, :, None]

    def index(y, limit):
        return ops.clip(ops.cast(y, "int32"), 0, limit - 1)

    top_i, bottom_i = index(top, height), index(ops.ceil(in_y), height)
    left_i, right_i = index(left, width), index(ops.ceil(in_x), width)
    pixels = ops.reshape(images, (-1, channels))
    base = ops.cast(image_index, "int32")[:, None, None] * (height * width)

    def gather(rows, cols):
        return ops.take(pixels, base + rows[:, :, None] * width + cols[:, None, :], axis=0)

    top_left, top_right = gather(top_i, left_i), gather(top_i, right_i)
    bottom_left, bottom_right = gather(bottom_i, left_i), gather(bottom_i, right_i)
    upper = top_left + (top_right - top_left) * x_lerp
    lower = bottom_left + (bottom_right - bottom_left) * x_lerp
    crops = upper + (lower - upper) * y_lerp
    inside = ops.logical_and(inside_y[:, :, None], inside_x[:, None, :])[..., None]
    return ops.where(inside, crops, ops.zeros_like(crops))


@keras.saving.register_keras_serializable(package="ot_layers")
class PatchExtractor(ExportableLayer):
    """Cuts images ``(B, H, W, C)`` into patches ``(B, P, patch_size, patch_size, C)`` for a backbone to embed.

    - ``"grid"``: the ``grid x grid`` cells of the image (``P = grid^2``), each resized (bilinear) to
      ``patch_size``; the image sides must be divisible by ``grid``.
    - ``"sampling"``: ``num_patches`` random square crops whose side is a uniform fraction in ``crop_fraction``
      ``(low, high)`` of the image side, resized to ``patch_size`` (fresh crops on every call, as DeepEMD samples at
      test time too). (``crop_fraction`` was ``scale`` in 0.1; ``scale`` now only names a multiplier of logits.)

    Embedding every patch with a backbone and global average pooling gives one node per patch; see
    :func:`local_embedding_model`. Not exportable in ``"sampling"`` mode (random crops). Written in ``keras.ops``
    (``keras.ops.image.resize`` for the cells, a bilinear gather with ``tf.image.crop_and_resize``'s sampling
    grid for the crops): runs on TensorFlow, JAX and PyTorch.
    """

    def __init__(self, mode="grid", grid=2, num_patches=9, patch_size=28, crop_fraction=(0.3, 0.7), seed=None,
                 **kwargs):
        super().__init__(**kwargs)
        self.mode = check_choice("mode", mode, MODES)
        self.grid = check_positive_int("grid", grid)
        self.num_patches = check_positive_int("num_patches", num_patches)
        self.patch_size = check_positive_int("patch_size", patch_size)
        if not isinstance(crop_fraction, (tuple, list)) or len(crop_fraction) != 2:
            raise ValueError(f"`crop_fraction` must be (low, high) with low <= high, got {crop_fraction!r}.")
        low, high = (float(check_in_range("crop_fraction", side, 0, 1, low_open=True)) for side in crop_fraction)
        if low > high:
            raise ValueError(f"`crop_fraction` must be (low, high) with low <= high, got {crop_fraction!r}.")
        self.crop_fraction = (low, high)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def _export_blocker_reason(self):
        """A reason for ``mode="sampling"`` (random crops), ``None`` for ``mode="grid"``."""
        return 'PatchExtractor(mode="sampling") draws random crops; export with mode="grid".' \
            if self.mode == "sampling" else None

    def patches_per_image(self):
        return self.grid ** 2 if self.mode == "grid" else self.num_patches

    def _grid_cells(self, images):
        """The ``grid x grid`` cells, exactly (:meth:`check_shape` refuses a known size ``grid`` does not divide).
        An unknown spatial size is read at run time; a size ``grid`` does not divide is then cropped to the nearest
        multiple."""
        height, width, channels = images.shape[1], images.shape[2], images.shape[3]
        if height is not None and width is not None:
            cell_h, cell_w = height // self.grid, width // self.grid
        else:
            shape = ops.shape(images)
            cell_h, cell_w = shape[1] // self.grid, shape[2] // self.grid
            images = images[:, :cell_h * self.grid, :cell_w * self.grid]
        cells = ops.reshape(images, (-1, self.grid, cell_h, self.grid, cell_w, channels))
        cells = ops.reshape(ops.transpose(cells, (0, 1, 3, 2, 4, 5)), (-1, cell_h, cell_w, channels))
        return ops.image.resize(cells, (self.patch_size, self.patch_size), interpolation="bilinear")

    def _random_crops(self, images):
        batch = ops.shape(images)[0]
        count = batch * self.num_patches
        side = keras.random.uniform([count], self.crop_fraction[0], self.crop_fraction[1], seed=self.seed_generator)
        y1 = keras.random.uniform([count], seed=self.seed_generator) * (1.0 - side)
        x1 = keras.random.uniform([count], seed=self.seed_generator) * (1.0 - side)
        image_index = ops.repeat(ops.arange(batch, dtype="int32"), self.num_patches)
        return crop_and_resize(images, ops.stack([y1, x1, y1 + side, x1 + side], axis=-1), image_index,
                               self.patch_size)

    def check_shape(self, shape):
        check_rank("images", shape, (4,))  # (batch, height, width, channels)
        height, width = shape[1], shape[2]
        if self.mode == "grid" and None not in (height, width) and (height % self.grid or width % self.grid):
            raise ValueError(f"`grid` ({self.grid}) must divide the image size {height}x{width}.")

    def build(self, input_shape):
        # the first call's inputs, checked before Keras' report of a failed call (see check_input_pair)
        self.check_shape(input_shape)

    def call(self, images):
        self.check_shape(images.shape)
        images = ops.cast(images, "float32")
        patches = self._grid_cells(images) if self.mode == "grid" else self._random_crops(images)
        patches = ops.reshape(patches, (-1, self.patches_per_image(), self.patch_size, self.patch_size,
                                        images.shape[-1]))
        return ops.cast(patches, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.patches_per_image(), self.patch_size, self.patch_size, input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(mode=self.mode, grid=self.grid, num_patches=self.num_patches, patch_size=self.patch_size,
                      crop_fraction=list(self.crop_fraction), seed=self.seed)
        return config


def local_embedding_model(backbone, input_shape, mode="grid", **patch_kwargs):
    """Images -> node sets ``(B, P, d)``: every patch embedded by ``backbone`` (a feature-map model) and averaged.

    ``mode``: ``"grid"`` or ``"sampling"`` (a :class:`PatchExtractor` of ``patch_kwargs``), or ``"fcn"`` (DeepEMD's
    default), which needs no patches: it is the backbone's feature map itself, and refuses ``patch_kwargs``, which
    it would not use.
    """
    check_choice("mode", mode, ("fcn",) + MODES)
    if mode == "fcn" and patch_kwargs:
        raise ValueError(f"`mode` 'fcn' embeds the whole feature map and takes no patch arguments, got "
                         f"{sorted(patch_kwargs)}; they apply to the modes {list(MODES)}.")
    images = keras.Input(shape=input_shape)
    if mode == "fcn":
        return keras.Model(images, backbone(images), name="fcn_embedding")
    patches = PatchExtractor(mode, **patch_kwargs)(images)
    pooled = keras.Sequential([backbone, keras.layers.GlobalAveragePooling2D()])
    return keras.Model(images, keras.layers.TimeDistributed(pooled)(patches), name=f"{mode}_embedding")
