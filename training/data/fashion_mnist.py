"""Fashion-MNIST from the local IDX files (Debian's ``dataset-fashion-mnist``)."""
import gzip
import os
import zlib

import numpy as np

from ot_layers.validation import check_non_negative_int
from training.data.errors import DataUnavailableError
from training.data.splits import protocol_split, select_classes

# Where the IDX files are looked for after the folder ``$OTZOO_FASHION_MNIST`` names (read at each call).
FASHION_MNIST_DIRS = (
    "/usr/share/datasets/fashion-mnist",
    os.path.join(os.environ.get("KERAS_HOME", os.path.expanduser("~/.keras")), "datasets", "fashion-mnist"),
)


_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def fashion_mnist_dir():
    """The first folder holding the four Fashion-MNIST IDX files, or ``None``. A folder named by
    ``$OTZOO_FASHION_MNIST`` that lacks one of them is a ``DataUnavailableError`` naming it (not a fall-back to the
    other folders, whose files the user did not ask for)."""
    chosen = os.environ.get("OTZOO_FASHION_MNIST", "")
    if chosen:
        missing = [f for pair in _FILES.values() for f in pair if not os.path.isfile(os.path.join(chosen, f))]
        if missing:
            raise DataUnavailableError(f"OTZOO_FASHION_MNIST={chosen} lacks the Fashion-MNIST IDX file(s) "
                                       f"{', '.join(missing)}.")
        return chosen
    for folder in FASHION_MNIST_DIRS:
        if folder and all(os.path.isfile(os.path.join(folder, f)) for pair in _FILES.values() for f in pair):
            return folder
    return None


_REINSTALL_HINT = "install the files again (apt-get install --reinstall dataset-fashion-mnist)"


def _read_idx(path):
    """The array in the gzipped IDX file ``path``; a file that is no such file (a broken gzip stream, another
    element type, too few or too many values) is a ``DataUnavailableError`` naming it."""
    try:
        with gzip.open(path, "rb") as handle:
            data = handle.read()
    except (OSError, EOFError, zlib.error) as error:  # gzip.BadGzipFile is an OSError
        raise DataUnavailableError(f"{path} is not a readable gzip file ({error}); {_REINSTALL_HINT}.") from error
    magic = int.from_bytes(data[:4], "big")
    ndim = magic & 0xFF
    if len(data) < 4 + 4 * ndim or magic >> 8 != 0x08:
        raise DataUnavailableError(f"{path} is not an unsigned-byte IDX file (magic {magic:#x}); {_REINSTALL_HINT}.")
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    expected = int(np.prod(dims))
    if array.size != expected:
        problem = "is truncated" if array.size < expected else "has the wrong size (extra bytes after the data)"
        raise DataUnavailableError(f"{path} {problem}: expected {expected} values, found {array.size}; "
                                   f"{_REINSTALL_HINT}.")
    return array.reshape(dims)


def load_fashion_mnist(split="train", limit=None, normalize=True):
    """Fashion-MNIST images ``(N, 28, 28, 1)`` (float32 in [0, 1] when ``normalize``) and int32 labels.

    Reads the original IDX files; raises ``DataUnavailableError`` (a ``FileNotFoundError``) with the install command
    when they are missing.
    ``limit`` keeps the first ``limit`` examples (for quick runs).
    """
    if split not in _FILES:
        raise ValueError(f"`split` must be one of {sorted(_FILES)}, got {split!r}.")
    folder = fashion_mnist_dir()
    if folder is None:
        raise DataUnavailableError(
            "Fashion-MNIST IDX files not found in any of "
            f"{[d for d in FASHION_MNIST_DIRS if d]}; install them with "
            "`apt-get install -y dataset-fashion-mnist` or set OTZOO_FASHION_MNIST."
        )
    limit = None if limit is None else check_non_negative_int("limit", limit)
    image_path, label_path = (os.path.join(folder, name) for name in _FILES[split])
    images, labels = _read_idx(image_path), _read_idx(label_path)
    if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.ndim != 1 or len(images) != len(labels) \
            or labels.max(initial=0) > 9:
        raise DataUnavailableError(f"{image_path} and {label_path} are no Fashion-MNIST {split} split: images "
                                   f"{images.shape} (expected (N, 28, 28)), labels {labels.shape} (expected (N,), "
                                   f"0..9); {_REINSTALL_HINT}.")
    labels = labels.astype(np.int32)
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    images = images[..., None]
    if normalize:
        images = images.astype(np.float32) / 255.0
    return images, labels


def fashion_mnist_split(protocol, part, limit=None, normalize=True, relabel=False):
    """Fashion-MNIST images and labels of one part of a class-split protocol.

    Retrieval: ``"train"`` = the training images of classes 0-4, ``"test"`` = the test images of classes 5-9;
    few-shot: ``"base"`` = the training images of classes 0-4, ``"novel"`` = the test images of classes 5-9.
    ``limit`` reads only the first ``limit`` images of the source split (before the class filter). Labels keep their
    original values (retrieval evaluation wants them); ``relabel=True`` maps the part's classes to
    ``0..len(classes)-1`` in increasing order.
    """
    classes, source = protocol_split("fashion_mnist", protocol, part)
    images, labels = load_fashion_mnist(source, limit=limit, normalize=normalize)
    return select_classes(images, labels, classes, relabel=relabel)
