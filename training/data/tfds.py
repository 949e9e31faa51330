"""The TFDS data sets by name (CIFAR-10/100, CUB-200-2011, Cars196, Stanford Online Products): their pipelines, augmentations and class-split protocols."""
import numpy as np

from ot_layers.optional import require, require_tensorflow, tensorflow_if_installed
from ot_layers.validation import check_non_negative_int, check_positive_int, check_seed
from training.data.errors import DataUnavailableError
from training.data.arrays import check_augmentation
from training.data.pipelines import pad_crop_flip
from training.data.splits import protocol_split

tf = tensorflow_if_installed("the TFDS data sets")


class _TfdsSpec:
    """How one TFDS builder is read: its label key, number of classes and augmentation family."""

    def __init__(self, label_key, num_classes, augmentation, image_size):
        self.label_key, self.num_classes = label_key, num_classes
        self.augmentation, self.image_size = augmentation, image_size


# All five builders store the pixels under "image" (uint8, 3 channels; CIFAR 32x32, the others of varying size).
TFDS_DATASETS = {
    "cifar10": _TfdsSpec("label", 10, "pad_crop_flip", 32),
    "cifar100": _TfdsSpec("label", 100, "pad_crop_flip", 32),  # fine labels; "coarse_label" holds the superclass
    "caltech_birds2011": _TfdsSpec("label", 200, "resize_crop_flip", 224),
    "cars196": _TfdsSpec("label", 196, "resize_crop_flip", 224),
    "stanford_online_products": _TfdsSpec("class_id", 22634, "resize_crop_flip", 224),  # also "super_class_id"
}


IMAGE_KEY = "image"
# The training augmentations of the TFDS pipelines, by the name a recipe's ``augment`` gives (``None``: the data set's
# own family, ``TFDS_DATASETS[name].augmentation``).
TFDS_AUGMENTATIONS = ("pad_crop_flip", "resize_crop_flip", "none")


def resize_shorter_side(image, size):
    """Resize ``image (H, W, C)`` (bilinear, antialiased) so that its shorter side is ``size``, keeping the aspect
    ratio; float32 in the input's value range."""
    shape = tf.cast(tf.shape(image)[:2], tf.float32)
    scale = tf.cast(size, tf.float32) / tf.reduce_min(shape)
    new_shape = tf.maximum(tf.cast(tf.round(shape * scale), tf.int32), size)
    return tf.image.resize(tf.cast(image, tf.float32), new_shape, method="bilinear", antialias=True)


def resize_crop_flip(image, image_size, resize_size, seed):
    """The fine-grained training augmentation: resize the shorter side to ``resize_size``, crop an
    ``image_size`` x ``image_size`` square at a random place, flip left-right with probability 1/2.
    ``seed``: a stateless seed ``(2,)``."""
    resized = resize_shorter_side(image, resize_size)
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    cropped = tf.image.stateless_random_crop(resized, [image_size, image_size, tf.shape(resized)[2]],
                                             seed=crop_seed)
    return tf.image.stateless_random_flip_left_right(cropped, seed=flip_seed)


def resize_center_crop(image, image_size, resize_size):
    """The fine-grained evaluation transform: resize the shorter side to ``resize_size``, crop the central
    ``image_size`` x ``image_size`` square."""
    resized = resize_shorter_side(image, resize_size)
    shape = tf.shape(resized)
    top, left = (shape[0] - image_size) // 2, (shape[1] - image_size) // 2
    return resized[top:top + image_size, left:left + image_size, :]


def _check_classes(classes, num_classes, name):
    if classes is None:
        return None
    items = None if isinstance(classes, (str, bytes)) or np.ndim(classes) != 1 else np.asarray(classes)
    if items is None or (items.size and not np.issubdtype(items.dtype, np.integer)):
        raise ValueError(f"`classes` must be a sequence of integer class ids, got {classes!r}.")
    classes = [int(c) for c in items]
    if not classes:
        raise ValueError("`classes` is empty: give at least one class id.")
    bad = [c for c in classes if not 0 <= c < num_classes]
    if bad:
        raise ValueError(f"`classes` of {name} must lie in [0, {num_classes - 1}], got {bad[:5]!r}.")
    if len(set(classes)) != len(classes):
        raise ValueError("`classes` holds duplicate class ids.")
    return classes


def _missing_message(name, data_dir, error):
    where = data_dir or "the default TFDS folder (~/tensorflow_datasets, or $TFDS_DATA_DIR)"
    return (
        f"TFDS data set {name!r} is not prepared in {where} ({error}). Prepare it with `tfds build {name}` (or "
        f"`python -c \"import tensorflow_datasets as tfds; tfds.builder('{name}').download_and_prepare()\"`), which "
        f"downloads it; on a machine without network, build it on one that has it and copy the folder "
        f"~/tensorflow_datasets/{name} here, then pass its parent folder as data_dir (`otzoo train --data-dir`) or "
        "set TFDS_DATA_DIR. Builders whose source files need a manual download say so in the `tfds build` output "
        "(put the files in <data_dir>/downloads/manual)."
    )


def tfds_dataset(name, split, batch_size, training=False, image_size=None, classes=None, relabel=False, seed=0,
                 data_dir=None, label_key=None, pad=4, resize_size=None, shuffle_buffer=None,
                 drop_remainder=None, download=False, augment=None, limit=None):
    """Batches of ``(float32 pixels in 0-255 (B, S, S, 3), int32 labels (B,))`` from a TFDS data set.

    ``name``: one of ``TFDS_DATASETS`` (cifar10, cifar100, caltech_birds2011, cars196, stanford_online_products);
    ``split``: a TFDS split expression ("train", "test", "train+test", "train[:10%]", ...). ``label_key`` overrides
    the builder's class label (``"label"``; ``"class_id"`` for stanford_online_products), e.g.
    ``"super_class_id"`` or cifar100's ``"coarse_label"``.

    ``classes`` keeps only the examples of these class ids; their labels stay the original ids unless ``relabel``,
    which maps ``classes[i]`` to ``i``. ``limit`` reads only the first ``limit`` examples of ``split`` (before the
    class filter; the files are then read in order). Augmentation with ``training`` (stateless, determined by
    ``seed`` like the shuffle, drawn anew every epoch), ``augment`` (one of :data:`TFDS_AUGMENTATIONS`; default the
    data set's own family): ``pad_crop_flip``: the evaluation image, then :func:`pad_crop_flip` with ``pad`` pixels
    (He et al. 2016; CIFAR's family); ``resize_crop_flip``: :func:`resize_crop_flip` (the fine-grained sets'
    family); ``none``: the evaluation image. Evaluation: CIFAR unchanged, the others :func:`resize_center_crop`.
    ``image_size`` (default 32 for CIFAR, 224 otherwise) is the output side; ``resize_size`` the shorter side
    after resizing (default ``round(image_size * 256 / 224)``, 256 for 224); CIFAR is resized to ``image_size``
    when it differs from 32. With ``training`` the files and the examples are shuffled (a ``shuffle_buffer``-long
    buffer of decoded images, reshuffled each epoch; default 10,000 for CIFAR, 1,000 for the fine-grained sets,
    whose full-size images take about 0.5 MB each) and the last incomplete batch dropped unless
    ``drop_remainder=False``.

    A data set not prepared in ``data_dir`` raises ``DataUnavailableError`` (a ``FileNotFoundError``) saying how to
    get it (``download=True`` lets TFDS download and prepare it, which needs network).
    """
    require_tensorflow(f"`dataset` {name!r} (a TFDS data set, read through tf.data on every backend)",
                       "use a data set read in memory (fashion_mnist)")
    tfds = require("tensorflow_datasets", "data", "reading TFDS data sets")  # heavy import, only needed here
    if name not in TFDS_DATASETS:
        raise ValueError(f"`name` must be one of {sorted(TFDS_DATASETS)}, got {name!r}.")
    if not isinstance(split, str) or not split:
        raise ValueError(f"`split` must be a TFDS split expression such as 'train' or 'test', got {split!r}.")
    spec = TFDS_DATASETS[name]
    augment = check_augmentation(spec.augmentation if augment is None else augment, TFDS_AUGMENTATIONS,
                                 f"the TFDS data set {name}")
    batch_size = check_positive_int("batch_size", batch_size)
    if limit is not None:
        limit = check_positive_int("limit", limit)
    image_size = spec.image_size if image_size is None else check_positive_int("image_size", image_size)
    if resize_size is None:  # CIFAR's own augmentation and evaluation never resize to it; resize_crop_flip on CIFAR
        resize_size = int(round(image_size * 256 / 224))  # does (at image_size the crop was the whole image)
    resize_size = check_positive_int("resize_size", resize_size)
    if resize_size < image_size:
        raise ValueError(f"`resize_size` ({resize_size}) must be >= `image_size` ({image_size}).")
    pad = check_non_negative_int("pad", pad)
    if shuffle_buffer is None:
        shuffle_buffer = 10_000 if spec.augmentation == "pad_crop_flip" else 1_000
    shuffle_buffer = check_positive_int("shuffle_buffer", shuffle_buffer)
    seed = check_seed("seed", seed)

    builder = tfds.builder(name, data_dir=data_dir)
    label_key = spec.label_key if label_key is None else label_key
    features = builder.info.features
    if label_key not in features or not hasattr(features[label_key], "num_classes"):
        keys = sorted(k for k in features if hasattr(features[k], "num_classes"))
        raise ValueError(f"`label_key` of {name} must be one of {keys}, got {label_key!r}.")
    num_classes = features[label_key].num_classes
    classes = _check_classes(classes, num_classes, name)
    if download:
        builder.download_and_prepare()
    read_config = tfds.ReadConfig(shuffle_seed=seed)
    try:
        # Images are decoded before the class filter: with ``decoders={"image": tfds.decode.SkipDecoding()}``
        # tfds.testing.mock_data switches to encoding whole random examples, whose random bounding boxes
        # (caltech_birds2011, cars196) fail ("BBox coordinates should have min <= max").
        data = builder.as_dataset(split=split, shuffle_files=bool(training) and limit is None,
                                  read_config=read_config)
    except AssertionError as error:  # TFDS's way of saying "not prepared"
        raise DataUnavailableError(_missing_message(name, data_dir, error)) from None
    if limit is not None:
        data = data.take(limit)
    data = data.map(lambda ex: (ex[IMAGE_KEY], tf.cast(ex[label_key], tf.int32)))
    if classes is not None:
        keep = tf.constant(_class_table(classes, num_classes))
        data = data.filter(lambda image, label: tf.gather(keep, label))
        if relabel:
            lookup = [-1] * num_classes
            for i, c in enumerate(classes):
                lookup[c] = i
            lookup = tf.constant(lookup, tf.int32)
            data = data.map(lambda image, label: (image, tf.gather(lookup, label)))

    def evaluation_image(image):
        if spec.augmentation == "pad_crop_flip":  # CIFAR: the whole image, resized when image_size is not 32
            if image_size != 32:
                image = tf.image.resize(image, [image_size, image_size], method="bilinear", antialias=True)
            return tf.ensure_shape(image, [image_size, image_size, 3])
        return resize_center_crop(image, image_size, resize_size)

    def transform(image, label, item_seed=None):
        image = tf.ensure_shape(tf.cast(image, tf.float32), [None, None, 3])
        if item_seed is not None and augment == "resize_crop_flip":
            image = resize_crop_flip(image, image_size, resize_size, item_seed)
        else:
            image = evaluation_image(image)
            if item_seed is not None and augment == "pad_crop_flip":
                image = pad_crop_flip(tf.ensure_shape(image, [image_size, image_size, 3]), pad, item_seed)
        image = tf.clip_by_value(tf.ensure_shape(image, [image_size, image_size, 3]), 0.0, 255.0)
        return image, label

    if not training:
        data = data.map(transform, num_parallel_calls=tf.data.AUTOTUNE)
        return data.batch(batch_size, drop_remainder=bool(drop_remainder)).prefetch(tf.data.AUTOTUNE)
    data = data.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    # new draws every epoch (as the shuffle): without rerandomize_each_iteration every epoch repeated the first's
    seeds = tf.data.Dataset.random(seed=seed + 1, rerandomize_each_iteration=True).map(
        lambda s: tf.stack([s, s // 7 + 1]))
    data = tf.data.Dataset.zip((data, seeds)).map(lambda xy, s: transform(xy[0], xy[1], s),
                                                  num_parallel_calls=tf.data.AUTOTUNE)
    drop = True if drop_remainder is None else bool(drop_remainder)
    return data.batch(batch_size, drop_remainder=drop).prefetch(tf.data.AUTOTUNE)


def _class_table(classes, num_classes):
    """A boolean table of length ``num_classes``, True at ``classes``."""
    table = [False] * num_classes
    for c in classes:
        table[c] = True
    return table


def tfds_split_dataset(name, protocol, part, batch_size, relabel=False, **kwargs):
    """:func:`tfds_dataset` restricted to one part of a class-split protocol (``training.data.CLASS_SPLITS``).

    ``protocol="retrieval"``, ``part`` in {"train", "test"}: the first / second half of the classes (Cars196
    0-97 / 98-195, CUB 0-99 / 100-199, SOP 0-11317 / 11318-22633, CIFAR-10 0-4 / 5-9, CIFAR-100 0-49 / 50-99).
    ``protocol="few_shot"``, ``part`` in {"base", "novel"} (and "val" for cifar100 (FC100) and
    caltech_birds2011 (Chen et al. 2019)). The images come from the split the protocol names. Labels stay the
    original class ids unless ``relabel``. Other arguments as :func:`tfds_dataset`.
    """
    if name not in TFDS_DATASETS:
        raise ValueError(f"`name` must be one of {sorted(TFDS_DATASETS)}, got {name!r}.")
    if "classes" in kwargs or "split" in kwargs:
        raise ValueError("`classes` and `split` are set by the protocol; use tfds_dataset to choose them.")
    classes, source = protocol_split(name, protocol, part)
    return tfds_dataset(name, source, batch_size, classes=classes, relabel=relabel, **kwargs)
