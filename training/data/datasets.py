"""The data sets a recipe trains on, by name: what each is (:data:`DATASETS`), the loader that reads it
(:data:`LOADERS`), and the preset's data description for it (:func:`data_spec`).

``fashion_mnist`` is read from its IDX files (``training.data.fashion_mnist``); ``cifar10``, ``cifar100``,
``caltech_birds2011``, ``cars196`` and ``stanford_online_products`` through TFDS (``training.data.tfds``; prepared on
the user's machine). A recipe reads one part of a data set: the ``"train"`` or ``"test"`` split for classification,
a part of a class-split protocol (``CLASS_SPLITS``: ``"retrieval"`` ``train`` / ``test``, ``"few_shot"`` ``base`` /
``novel``) otherwise. Every loader gives the same two things: :meth:`batches` (a ``tf.data`` pipeline of
``(float32 pixels in 0-255, int32 labels)`` with the recipe's augmentation; for Fashion-MNIST on JAX and PyTorch a
``training.data.arrays.ArrayBatches``, which needs no TensorFlow) and :meth:`arrays` (the part in memory,
for episodes).
"""
from dataclasses import dataclass
from typing import Tuple

import numpy as np

from ot_layers.optional import tensorflow_if_installed
from ot_layers.validation import check_non_negative_int, check_positive_int, check_seed
from training.data.errors import EmptySliceError
from training.data.fashion_mnist import fashion_mnist_split, load_fashion_mnist
from training.data.arrays import check_augmentation
from training.data.pipelines import array_batches
from training.data.splits import CLASS_SPLITS, protocol_split
from training.data.tfds import TFDS_AUGMENTATIONS, TFDS_DATASETS, tfds_dataset
from zoo.spec import DataSpec

tf = tensorflow_if_installed("the TFDS data sets")


@dataclass(frozen=True)
class DataSetInfo:
    """One data set: its images' shape at the default size, classes, pixel statistics (in [0, 1] units, over the
    channels: the zoo models normalize with one mean and one standard deviation) and the loader (``LOADERS`` key)."""
    input_shape: Tuple[int, int, int]
    num_classes: int
    pixel_mean: float
    pixel_std: float
    loader: str


DATASETS = {
    "fashion_mnist": DataSetInfo((28, 28, 1), 10, 0.2860406, 0.3530242, "idx"),  # the 60k training images'
    "cifar10": DataSetInfo((32, 32, 3), 10, 0.4734, 0.2516, "tfds"),  # the 50k training images', channel means
    "cifar100": DataSetInfo((32, 32, 3), 100, 0.4782, 0.2682, "tfds"),
    # The fine-grained sets: ImageNet's statistics (their usual normalization), 224 x 224 crops.
    "caltech_birds2011": DataSetInfo((224, 224, 3), 200, 0.449, 0.226, "tfds"),
    "cars196": DataSetInfo((224, 224, 3), 196, 0.449, 0.226, "tfds"),
    "stanford_online_products": DataSetInfo((224, 224, 3), 22634, 0.449, 0.226, "tfds"),
}

PARTS = {None: ("train", "test"), "retrieval": ("train", "test"), "few_shot": ("base", "novel")}
_PROTOCOL_OF_TASK = {"classification": None, "retrieval": "retrieval", "few_shot": "few_shot"}


def dataset_info(name):
    """The :class:`DataSetInfo` of ``name``; an unknown name raises ``ValueError`` naming the accepted ones."""
    if name not in DATASETS:
        raise ValueError(f"`dataset` must be one of {sorted(DATASETS)}, got {name!r}.")
    return DATASETS[name]


def input_shape_of(name, image_size=None):
    """The model input shape for data set ``name`` (``image_size``: the side of the TFDS images; Fashion-MNIST is
    28 x 28 only)."""
    info = dataset_info(name)
    if image_size is None or image_size == info.input_shape[0]:
        return info.input_shape
    if info.loader == "idx":
        raise ValueError(f"`image_size` applies to the TFDS data sets; {name} images are {info.input_shape[0]} x "
                         f"{info.input_shape[1]}, got {image_size}.")
    return (check_positive_int("image_size", image_size),) * 2 + (info.input_shape[2],)


def data_spec(name, task, image_size=None):
    """The :class:`zoo.spec.DataSpec` of a ``task`` preset trained on data set ``name``: its input shape, classes,
    pixel statistics and, for retrieval and few-shot presets, the protocol's class split (``CLASS_SPLITS``)."""
    info = dataset_info(name)
    shape = input_shape_of(name, image_size)
    if task not in _PROTOCOL_OF_TASK:
        raise ValueError(f"`task` must be one of {list(_PROTOCOL_OF_TASK)}, got {task!r}.")
    protocol = _PROTOCOL_OF_TASK[task]
    if protocol is None:
        return DataSpec(name, shape, info.num_classes, info.pixel_mean, info.pixel_std,
                        split=f"{name}: train / test")
    first, second = PARTS[protocol]
    train_classes, train_source = protocol_split(name, protocol, first)
    eval_classes, eval_source = protocol_split(name, protocol, second)
    split = (f"{name} {protocol} protocol: {first}: {train_source} images of {_describe(train_classes)} / {second}: "
             f"{eval_source} images of {_describe(eval_classes)}")
    return DataSpec(name, shape, len(train_classes), info.pixel_mean, info.pixel_std, split=split,
                    train_classes=tuple(train_classes), eval_classes=tuple(eval_classes))


def _describe(classes):
    classes = list(classes)
    if classes == list(range(classes[0], classes[-1] + 1)):
        return f"classes {classes[0]}-{classes[-1]} ({len(classes)})"
    return f"{len(classes)} classes ({', '.join(map(str, classes[:4]))}, ...)"


def check_dataset_augmentation(name, augment, task=None):
    """``augment`` if data set ``name``'s loader has it for ``task`` (in-memory arrays: ``pad_crop_flip``, ``none``;
    TFDS: also ``resize_crop_flip``, except for the few-shot task, whose recipe reads its TFDS images into memory),
    else a ``ValueError`` naming the recipe field and the accepted values."""
    if dataset_info(name).loader == "tfds" and task != "few_shot":
        return check_augmentation(augment, TFDS_AUGMENTATIONS, f"the TFDS data set {name}")
    where = f"{name} (in memory)" if task != "few_shot" else f"a few-shot run on {name} (its images in memory)"
    return check_augmentation(augment, where=where)


class Batches:
    """A ``tf.data`` pipeline (or ``ArrayBatches``) of one data part with its number of examples (``examples``, before dropping an
    incomplete batch) and ``sample``: up to 256 of its images, unaugmented, as float32 (for layer initializations
    such as ``GSPPrototypeInit``)."""

    def __init__(self, dataset, examples, sample):
        self.dataset, self.examples, self.sample = dataset, int(examples), sample


class IdxLoader:
    """Fashion-MNIST from the IDX files, in memory: the batches of ``training.data.pipelines.array_batches``
    (``tf.data`` on TensorFlow, NumPy on JAX and PyTorch)."""

    def arrays(self, name, part, protocol=None, limit=None, relabel=False, image_size=None, data_dir=None):
        input_shape_of(name, image_size)
        if protocol is None:
            return load_fashion_mnist(part, limit=limit, normalize=False)
        return fashion_mnist_split(protocol, part, limit=limit, normalize=False, relabel=relabel)

    def batches(self, name, part, batch_size, protocol=None, training=False, augment="pad_crop_flip", pad=2, seed=0,
                limit=None, relabel=False, image_size=None, data_dir=None):
        images, labels = self.arrays(name, part, protocol, limit, relabel, image_size, data_dir)
        _check_slice(len(labels), name, part, protocol, limit, batch_size if training else None)
        dataset = array_batches(images, labels, batch_size, training=training, pad=pad, seed=seed, augment=augment)
        return Batches(dataset, len(labels), images[:256].astype("float32"))


class TfdsLoader:
    """The TFDS data sets, streamed (``training.data.tfds.tfds_dataset``); ``arrays`` reads a part into memory at
    its evaluation transform (uint8)."""

    def _source(self, name, part, protocol):
        if protocol is None:
            return None, part
        return protocol_split(name, protocol, part)

    def batches(self, name, part, batch_size, protocol=None, training=False, augment=None, pad=4, seed=0, limit=None,
                relabel=False, image_size=None, data_dir=None):
        check_augmentation(TFDS_DATASETS[name].augmentation if augment is None else augment, TFDS_AUGMENTATIONS,
                           f"the TFDS data set {name}")
        classes, split = self._source(name, part, protocol)
        common = dict(classes=classes, relabel=relabel, image_size=image_size, data_dir=data_dir, limit=limit)
        examples = _count(tfds_dataset(name, split, 1024, **common))
        _check_slice(examples, name, part, protocol, limit, batch_size if training else None)
        sample = next(iter(tfds_dataset(name, split, 256, **common)))[0].numpy()
        dataset = tfds_dataset(name, split, batch_size, training=training, seed=seed, pad=pad, augment=augment,
                               **common)
        return Batches(dataset, examples, sample)

    def arrays(self, name, part, protocol=None, limit=None, relabel=False, image_size=None, data_dir=None):
        classes, split = self._source(name, part, protocol)
        images, labels = [], []
        for x, y in tfds_dataset(name, split, 256, classes=classes, relabel=relabel, image_size=image_size,
                                 data_dir=data_dir, limit=limit):
            images.append(np.round(x.numpy()).astype(np.uint8))
            labels.append(y.numpy())
        if not labels:
            _check_slice(0, name, part, protocol, limit)
        return np.concatenate(images), np.concatenate(labels).astype(np.int32)


def _count(dataset):
    return int(dataset.reduce(tf.constant(0, tf.int64), lambda n, batch: n + tf.cast(tf.shape(batch[1])[0],
                                                                                       tf.int64)).numpy())


def _check_slice(examples, name, part, protocol, limit, batch_size=None):
    """An ``EmptySliceError`` when the part holds no image, or fewer than one ``batch_size`` batch (a training
    pipeline drops its last incomplete batch: it would make none)."""
    if examples == 0 or (batch_size is not None and examples < batch_size):
        where = f"the {part} part of the {protocol} protocol" if protocol else f"the {part} split"
        count = "no images" if examples == 0 else f"{examples} images, fewer than one training batch of {batch_size}"
        detail = f"{where} of {name} holds {count}"
        if limit is not None:
            raise EmptySliceError(f"{detail} among the first {limit} images of its source split", "limit", limit)
        raise EmptySliceError(f"{detail}.")


LOADERS = {"idx": IdxLoader(), "tfds": TfdsLoader()}


def loader_for(name):
    """The loader that reads data set ``name`` (``LOADERS[DATASETS[name].loader]``)."""
    return LOADERS[dataset_info(name).loader]


def image_batches(name, part, batch_size, protocol=None, training=False, augment=None, pad=None, seed=0,
                  limit=None, relabel=False, image_size=None, data_dir=None):
    """:class:`Batches` of one part of data set ``name`` (see the module docstring); ``augment``: the recipe's
    (``check_augmentation`` names the accepted ones for the data set). ``augment`` and ``pad`` left ``None`` are the
    data set's own: ``pad_crop_flip`` with 2 pixels for Fashion-MNIST (28 x 28), with 4 for CIFAR (He et al. 2016),
    ``resize_crop_flip`` for the fine-grained sets, as ``tfds_dataset`` (fixed defaults ``pad_crop_flip``, ``pad=2``
    gave CIFAR 2-pixel pads and the fine-grained sets pad-crop-flip). A training part smaller than one batch (the
    last incomplete batch is dropped: there would be none) is an ``EmptySliceError`` naming ``limit``."""
    # checked before a split is read, counted or a sample decoded
    batch_size, seed = check_positive_int("batch_size", batch_size), check_seed("seed", seed)
    own = {}  # the arguments given; the loader's defaults (the data set's) otherwise
    if augment is not None:
        own["augment"] = augment
    if pad is not None:
        own["pad"] = check_non_negative_int("pad", pad)
    return loader_for(name).batches(name, part, batch_size, protocol=protocol, training=training, seed=seed,
                                    limit=limit, relabel=relabel, image_size=image_size, data_dir=data_dir, **own)


def image_arrays(name, part, protocol=None, limit=None, relabel=False, image_size=None, data_dir=None):
    """``(images (N, H, W, C) uint8, labels (N,) int32)`` of one part of data set ``name`` in memory."""
    return loader_for(name).arrays(name, part, protocol=protocol, limit=limit, relabel=relabel,
                                   image_size=image_size, data_dir=data_dir)


__all__ = ["DATASETS", "LOADERS", "DataSetInfo", "Batches", "dataset_info", "data_spec", "input_shape_of",
           "image_batches", "image_arrays", "loader_for", "CLASS_SPLITS", "check_augmentation"]
