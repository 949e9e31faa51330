"""Class splits: which classes train and which evaluate, by data set and protocol (retrieval, few-shot)."""
import numpy as np

from ot_layers.validation import check_labels


def select_classes(images, labels, classes, relabel=True):
    """Keep the examples whose label is in ``classes``; ``relabel`` maps ``classes[i]`` to ``i``. ``classes``: distinct
    integer class ids (a duplicate would leave a label of ``0..len(classes)-1`` unused)."""
    classes = [c for c in np.asarray(classes).reshape(-1)] if not isinstance(classes, str) else None
    if not classes or not all(isinstance(c, np.integer) for c in classes):
        raise ValueError("`classes` must be a non-empty sequence of integer class ids.")
    classes = [int(c) for c in classes]
    if len(set(classes)) != len(classes):
        repeated = sorted(c for c in set(classes) if classes.count(c) > 1)
        raise ValueError(f"`classes` holds duplicate class ids: {repeated}.")
    if len(images) != len(labels):
        raise ValueError(f"`images` has {len(images)} samples but `labels` has {len(labels)}.")
    images, labels = np.asarray(images), check_labels(labels).reshape(-1)  # (N,) or (N, 1), as everywhere else
    mask = np.isin(labels, classes)
    kept_labels = labels[mask]
    if relabel:
        lookup = {c: i for i, c in enumerate(classes)}
        kept_labels = np.array([lookup[int(c)] for c in kept_labels], dtype=np.int32)
    return images[mask], kept_labels


# CIFAR-100 fine label -> coarse label (superclass), the mapping shipped with CIFAR-100 (``coarse_label`` in TFDS).
CIFAR100_COARSE = (
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11, 6, 11, 5, 10, 7, 6, 13, 15, 3, 15,
    0, 11, 1, 10, 12, 14, 16, 9, 11, 5, 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13, 16, 19, 2, 4, 6, 19, 5, 5, 8, 19,
    18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
)


# FC100 (Oreshkin et al. 2018, TADAM): 12 / 4 / 4 superclasses for base / validation / novel classes.
FC100_SUPERCLASSES = {"base": (1, 2, 3, 4, 5, 6, 9, 10, 15, 17, 18, 19), "val": (8, 11, 13, 16),
                      "novel": (0, 7, 12, 14)}


def _fine_classes(superclasses):
    return tuple(c for c, s in enumerate(CIFAR100_COARSE) if s in superclasses)


def _halves(num_classes, first="train", second="test", sources=("train", "test")):
    half = (num_classes + 1) // 2
    return {first: (tuple(range(half)), sources[0]), second: (tuple(range(half, num_classes)), sources[1])}


# ``CLASS_SPLITS[data set][protocol][part] = (classes, source split)``: the classes of a part and the split of the
# data set (a TFDS split expression, or "train" / "test" for the Fashion-MNIST IDX files) their images come from.
CLASS_SPLITS = {
    # Retrieval: training classes 0-4, test classes 5-9; few-shot: base 0-4, novel 5-9 (the project's protocol,
    # as in experiments/gsp_fashion_mnist.py and emd_fewshot.py): training / base images from the training split,
    # test / novel images from the test split.
    "fashion_mnist": {"retrieval": _halves(10), "few_shot": _halves(10, "base", "novel")},
    "cifar10": {"retrieval": _halves(10), "few_shot": _halves(10, "base", "novel")},
    # Retrieval: fine classes 0-49 / 50-99; few-shot: FC100's superclass split (60 / 20 / 20 fine classes, all
    # 600 images of each class).
    "cifar100": {
        "retrieval": _halves(100),
        "few_shot": {part: (_fine_classes(sc), "train+test") for part, sc in FC100_SUPERCLASSES.items()},
    },
    # Retrieval (Oh Song et al. 2016): classes 0-99 (5,864 images) / 100-199 (5,924 images) over all 11,788
    # images. Few-shot (Chen et al. 2019, "A Closer Look at Few-shot Classification"): base = even class indices
    # (100), val = indices 1 mod 4 (50), novel = indices 3 mod 4 (50).
    "caltech_birds2011": {
        "retrieval": _halves(200, sources=("train+test", "train+test")),
        "few_shot": {"base": (tuple(range(0, 200, 2)), "train+test"),
                     "val": (tuple(range(1, 200, 4)), "train+test"),
                     "novel": (tuple(range(3, 200, 4)), "train+test")},
    },
    # Retrieval (Oh Song et al. 2016): classes 0-97 (8,054 images) / 98-195 (8,131 images) over all 16,185
    # images; few-shot: the same halves as base / novel (no standard few-shot split exists for Cars196).
    "cars196": {
        "retrieval": _halves(196, sources=("train+test", "train+test")),
        "few_shot": _halves(196, "base", "novel", sources=("train+test", "train+test")),
    },
    # Retrieval (Oh Song et al. 2016): classes 0-11317 (11,318 classes, 59,551 images: TFDS "train") / 11318-22633
    # (11,316 classes, 60,502 images: TFDS "test"); few-shot: the same classes as base / novel.
    "stanford_online_products": {
        "retrieval": {"train": (tuple(range(11318)), "train"), "test": (tuple(range(11318, 22634)), "test")},
        "few_shot": {"base": (tuple(range(11318)), "train"), "novel": (tuple(range(11318, 22634)), "test")},
    },
}


PROTOCOLS = ("retrieval", "few_shot")


def protocol_split(dataset, protocol, part):
    """``(classes, source_split)`` of one part of a class-split protocol (see ``CLASS_SPLITS``).

    ``protocol``: ``"retrieval"`` (parts ``"train"`` / ``"test"``: the first half of the classes to train, the
    second half to test) or ``"few_shot"`` (parts ``"base"`` / ``"novel"``, and ``"val"`` where the benchmark
    defines one). ``source_split`` is the split of the data set the part's images are read from.
    """
    if dataset not in CLASS_SPLITS:
        raise ValueError(f"`dataset` must be one of {sorted(CLASS_SPLITS)}, got {dataset!r}.")
    if protocol not in PROTOCOLS:
        raise ValueError(f"`protocol` must be one of {list(PROTOCOLS)}, got {protocol!r}.")
    parts = CLASS_SPLITS[dataset][protocol]
    if part not in parts:
        raise ValueError(f"`part` of the {protocol} protocol of {dataset} must be one of {list(parts)}, got {part!r}.")
    return parts[part]


def class_split(dataset, protocol, part):
    """The sorted class ids of one part of a class-split protocol, e.g. ``class_split("cars196", "retrieval",
    "test") == (98, ..., 195)``."""
    return protocol_split(dataset, protocol, part)[0]
