"""TFDS pipelines (run on ``tfds.testing.mock_data``, offline), the class-split protocols and their Fashion-MNIST
counterparts. Pipeline outputs are compared with the raw mock examples read straight from TFDS and with numpy
re-implementations of the class filter, the crops and the flips."""
import numpy as np
import pytest
import tensorflow as tf

try:
    import tensorflow_datasets as tfds
except ImportError:  # the TFDS tests are skipped (an error under OTZOO_REQUIRE_REFERENCES), the class splits run
    tfds = None

from training.data.splits import (CIFAR100_COARSE, CLASS_SPLITS, FC100_SUPERCLASSES, class_split, protocol_split,
                                  select_classes)
from training.data.fashion_mnist import fashion_mnist_split, load_fashion_mnist
from training.data.tfds import TFDS_DATASETS, resize_shorter_side, tfds_dataset, tfds_split_dataset

NAMES = sorted(TFDS_DATASETS)
NUM_EXAMPLES = 48


def raw_examples(name, split, label_key=None):
    """The mock examples as TFDS yields them: lists of uint8 images and int labels."""
    key = label_key or TFDS_DATASETS[name].label_key
    data = tfds.load(name, split=split)
    images, labels = [], []
    for example in data:
        images.append(example["image"].numpy())
        labels.append(int(example[key].numpy()))
    return images, np.array(labels)


def collect(dataset):
    images, labels = [], []
    for x, y in dataset:
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels)


# the tests of the class-split tables and of Fashion-MNIST, which read no TFDS data set
WITHOUT_TFDS = {"test_class_split_numbers", "test_fc100_matches_the_mock_coarse_labels_definition",
                "test_fashion_mnist_split_keeps_or_remaps_labels"}


@pytest.fixture(autouse=True)
def mock_tfds(request):
    """Every TFDS test reads mock TFDS data (offline), except the one about a missing data set; without
    tensorflow_datasets they are skipped."""
    name = request.function.__name__
    if name not in WITHOUT_TFDS:
        pytest.importorskip("tensorflow_datasets")
    if name in WITHOUT_TFDS or name == "test_missing_data_set_says_how_to_get_it":
        yield
        return
    with tfds.testing.mock_data(num_examples=NUM_EXAMPLES):
        yield


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_shapes_dtypes_range_and_class_filter(name, training):
    size = 32 if name.startswith("cifar") else 24
    classes, source = protocol_split(name, "retrieval", "test")
    data = tfds_split_dataset(name, "retrieval", "test", batch_size=4, training=training,
                              image_size=None if name.startswith("cifar") else size)
    images, labels = collect(data)
    assert images.dtype == np.float32 and labels.dtype == np.int32
    assert images.shape[1:] == (size, size, 3)
    assert images.min() >= 0.0 and images.max() <= 255.0 and images.max() > 1.0  # pixels in 0-255, not 0-1
    _, raw_labels = raw_examples(name, source)
    expected = np.sort(raw_labels[np.isin(raw_labels, classes)])  # the independent class filter
    assert len(expected) >= 4, "the mock should hold examples of the split's classes"
    if training:  # shuffled, incomplete last batch dropped
        assert len(labels) == len(expected) // 4 * 4
        assert set(labels) <= set(expected)
    else:  # original labels kept (retrieval evaluation wants them)
        np.testing.assert_array_equal(np.sort(labels), expected)


@pytest.mark.parametrize("name", ["cifar10", "cars196"])
def test_relabel_maps_classes_to_their_positions(name):
    classes = class_split(name, "retrieval", "test")
    source = protocol_split(name, "retrieval", "test")[1]
    image_size = None if name.startswith("cifar") else 16
    _, labels = collect(tfds_dataset(name, source, 8, classes=classes, relabel=True, image_size=image_size))
    _, raw_labels = raw_examples(name, source)
    kept = raw_labels[np.isin(raw_labels, classes)]
    np.testing.assert_array_equal(labels, np.searchsorted(np.array(classes), kept))
    assert labels.min() >= 0 and labels.max() < len(classes)


def test_cifar_evaluation_is_the_raw_pixels_and_training_is_pad_crop_flip():
    raw_images, raw_labels = raw_examples("cifar10", "train")
    images, labels = collect(tfds_dataset("cifar10", "train", 8))
    np.testing.assert_array_equal(images, np.stack(raw_images).astype(np.float32))
    np.testing.assert_array_equal(labels, raw_labels)
    # shuffle_buffer=1 keeps the order, so each augmented image pairs with its raw image
    augmented, aug_labels = collect(tfds_dataset("cifar10", "train", 8, training=True, shuffle_buffer=1, seed=3))
    np.testing.assert_array_equal(aug_labels, raw_labels[:len(aug_labels)])
    flips = 0
    for image, raw in zip(augmented, raw_images):
        padded = np.pad(raw.astype(np.float32), ((4, 4), (4, 4), (0, 0)))
        windows = [(padded[i:i + 32, j:j + 32], f) for i in range(9) for j in range(9) for f in (False, True)]
        matches = [f for w, f in windows if np.array_equal(w[:, ::-1] if f else w, image)]
        assert matches, "every training image is a flipped or unflipped 32x32 window of the 4-padded image"
        flips += all(matches)
    assert 0 < flips < len(augmented)  # both flipped and unflipped images occur


def test_fine_grained_evaluation_is_resize_and_center_crop():
    raw_images, _ = raw_examples("caltech_birds2011", "test")
    images, _ = collect(tfds_dataset("caltech_birds2011", "test", 8, image_size=20, resize_size=26))
    for image, raw in zip(images, raw_images):
        resized = resize_shorter_side(raw, 26).numpy()
        assert min(resized.shape[:2]) == 26
        ratio = (resized.shape[0] / resized.shape[1]) / (raw.shape[0] / raw.shape[1])
        assert abs(ratio - 1) < 0.1  # aspect ratio kept (up to rounding of the tiny mock images)
        top, left = (resized.shape[0] - 20) // 2, (resized.shape[1] - 20) // 2
        np.testing.assert_allclose(image, resized[top:top + 20, left:left + 20], atol=1e-4)


def test_fine_grained_training_crops_windows_of_the_resized_image():
    raw_images, _ = raw_examples("cars196", "train")
    images, _ = collect(tfds_dataset("cars196", "train", 8, training=True, image_size=16, resize_size=20,
                                     shuffle_buffer=1, seed=5))
    for image, raw in zip(images, raw_images):
        resized = resize_shorter_side(raw, 20).numpy()
        height, width = resized.shape[:2]
        found = any(np.allclose(w[:, ::-1] if f else w, image, atol=1e-4)
                    for i in range(height - 15) for j in range(width - 15)
                    for w in [resized[i:i + 16, j:j + 16]] for f in (False, True))
        assert found


def test_resize_crop_flip_on_cifar_crops_windows_of_the_enlarged_image():
    """``augment="resize_crop_flip"`` on CIFAR resized to ``image_size`` itself by default, so its crop was the
    whole image: flips only. The default is ``round(image_size * 256 / 224)`` (37 for 32), as documented."""
    raw_images, _ = raw_examples("cifar10", "train")
    images, _ = collect(tfds_dataset("cifar10", "train", 8, training=True, augment="resize_crop_flip",
                                     shuffle_buffer=1, seed=2))
    moved = 0
    for image, raw in zip(images, raw_images):
        resized = resize_shorter_side(raw, 37).numpy()
        windows = {(i, j) for i in range(6) for j in range(6) for f in (False, True)
                   if np.allclose(resized[i:i + 32, j:j + 32][:, ::-1] if f else resized[i:i + 32, j:j + 32], image,
                                  atol=1e-4)}
        assert windows, "every training image is a 32x32 window of the image resized to 37"
        moved += not any(np.allclose(image, r) for r in (raw, raw[:, ::-1]))
    assert moved == len(images)  # none is the raw image or its mirror


@pytest.mark.parametrize("name", ["cifar100", "stanford_online_products"])
def test_augmentation_is_determined_by_the_seed(name):
    kwargs = dict(training=True, image_size=None if name.startswith("cifar") else 16)
    first = collect(tfds_dataset(name, "train", 8, seed=7, **kwargs))
    again = collect(tfds_dataset(name, "train", 8, seed=7, **kwargs))
    other = collect(tfds_dataset(name, "train", 8, seed=8, **kwargs))
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    assert not np.array_equal(first[0], other[0])  # another seed: another order and other crops / flips
    assert len(first[1]) == len(other[1]) > 0


def test_augmentation_is_drawn_anew_every_epoch():
    """The per-example augmentation seeds were drawn once: with the order kept (``shuffle_buffer=1``) every epoch
    repeated the first one's crops and flips. They change every epoch now; a fresh pipeline with the same seed
    repeats them."""
    kwargs = dict(training=True, shuffle_buffer=1, limit=16, seed=3)
    data = tfds_dataset("cifar10", "train", 8, **kwargs)
    epochs = [collect(data) for _ in range(3)]
    for images, labels in epochs[1:]:
        np.testing.assert_array_equal(labels, epochs[0][1])  # the same examples in the same order ...
        assert not np.array_equal(images, epochs[0][0])  # ... augmented otherwise
    again = tfds_dataset("cifar10", "train", 8, **kwargs)
    for (images, labels), (first_images, first_labels) in zip([collect(again) for _ in range(3)], epochs):
        np.testing.assert_array_equal(images, first_images)
        np.testing.assert_array_equal(labels, first_labels)


def test_seed_and_pad_are_checked_as_the_other_loaders_check_them():
    """A NumPy integer seed was refused ("`seed` must be an integer, got np.int64(1)"), a negative one taken, and a
    fractional pad truncated (2.5 -> 2)."""
    kwargs = dict(training=True, shuffle_buffer=1, limit=8)
    numpy_seed = collect(tfds_dataset("cifar10", "train", 8, seed=np.int64(1), **kwargs))
    int_seed = collect(tfds_dataset("cifar10", "train", 8, seed=1, **kwargs))
    np.testing.assert_array_equal(numpy_seed[0], int_seed[0])
    for bad in (dict(seed=-1), dict(seed=1.5), dict(seed=None), dict(seed=True)):
        with pytest.raises(ValueError, match="^`seed` must be an integer >= 0"):
            tfds_dataset("cifar10", "train", 8, **bad)
    for bad in (2.5, -1, True):
        with pytest.raises(ValueError, match="^`pad` must be an integer >= 0"):
            tfds_dataset("cifar10", "train", 8, pad=bad)
    collect(tfds_dataset("cifar10", "train", 8, pad=np.int64(2), **kwargs))


@pytest.mark.parametrize("name, kwargs, old", [
    ("cifar10", {}, dict(pad=2)),
    ("caltech_birds2011", dict(image_size=16), dict(augment="pad_crop_flip", pad=2)),
])
def test_image_batches_defaults_are_the_data_sets_own(name, kwargs, old):
    """``training.data.datasets.image_batches`` passed ``augment="pad_crop_flip", pad=2`` to every loader when
    called without them: CIFAR trained on 2-pixel pads (its own, ``tfds_dataset``'s, is 4), the fine-grained sets on
    pad-crop-flip of the centre crop, not their resize_crop_flip. Its defaults are the data set's own now; given
    values still pass through."""
    from training.data.datasets import image_batches

    common = dict(training=True, seed=3, **kwargs)
    images, labels = collect(image_batches(name, "train", 8, **common).dataset)
    own_images, own_labels = collect(tfds_dataset(name, "train", 8, **common))
    np.testing.assert_array_equal(labels, own_labels)
    np.testing.assert_array_equal(images, own_images)
    assert not np.array_equal(images, collect(tfds_dataset(name, "train", 8, **common, **old))[0])  # tells them apart
    given = collect(image_batches(name, "train", 8, **common, **old).dataset)[0]
    np.testing.assert_array_equal(given, collect(tfds_dataset(name, "train", 8, **common, **old))[0])


def test_label_key_override():
    _, coarse = raw_examples("cifar100", "test", label_key="coarse_label")
    _, labels = collect(tfds_dataset("cifar100", "test", 16, label_key="coarse_label"))
    np.testing.assert_array_equal(labels, coarse)
    _, super_ids = raw_examples("stanford_online_products", "test", label_key="super_class_id")
    _, labels = collect(tfds_dataset("stanford_online_products", "test", 16, label_key="super_class_id",
                                     image_size=8))
    np.testing.assert_array_equal(labels, super_ids)
    with pytest.raises(ValueError, match="`label_key` of cars196 must be one of \\['label'\\]"):
        tfds_dataset("cars196", "test", 4, label_key="class_id")


def test_unknown_names_and_bad_arguments():
    with pytest.raises(ValueError, match="`name` must be one of") as info:
        tfds_dataset("imagenet2012", "train", 8)
    for name in NAMES:
        assert repr(name) in str(info.value)
    with pytest.raises(ValueError, match="`name` must be one of"):
        tfds_split_dataset("mnist", "retrieval", "train", 8)
    with pytest.raises(ValueError, match="`batch_size` must be an integer >= 1"):
        tfds_dataset("cifar10", "train", 0)
    with pytest.raises(ValueError, match=r"`classes` of cifar10 must lie in \[0, 9\]"):
        tfds_dataset("cifar10", "train", 8, classes=[3, 10])
    with pytest.raises(ValueError, match="`classes` is empty"):
        tfds_dataset("cifar10", "train", 8, classes=[])
    with pytest.raises(ValueError, match="`split` must be a TFDS split expression"):
        tfds_dataset("cifar10", "", 8)
    with pytest.raises(ValueError, match="`resize_size` \\(16\\) must be >= `image_size` \\(32\\)"):
        tfds_dataset("cars196", "train", 8, image_size=32, resize_size=16)
    with pytest.raises(ValueError, match="`protocol` must be one of"):
        tfds_split_dataset("cifar10", "zero_shot", "train", 8)
    with pytest.raises(ValueError, match="`part` of the few_shot protocol of cifar10 must be one of"):
        tfds_split_dataset("cifar10", "few_shot", "train", 8)
    with pytest.raises(ValueError, match="set by the protocol"):
        tfds_split_dataset("cifar10", "retrieval", "train", 8, classes=[0])


def test_missing_data_set_says_how_to_get_it(tmp_path):
    """Outside the mock (see the fixture), an empty data_dir: a FileNotFoundError that says how to get the data."""
    with pytest.raises(FileNotFoundError) as info:
        tfds_dataset("cars196", "train", 8, data_dir=str(tmp_path))
    message = str(info.value)
    for text in ("'cars196' is not prepared in", str(tmp_path), "tfds build cars196", "as data_dir",
                 "TFDS_DATA_DIR"):
        assert text in message
    with pytest.raises(FileNotFoundError, match="tfds build stanford_online_products"):
        tfds_split_dataset("stanford_online_products", "retrieval", "test", 8, data_dir=str(tmp_path))


def test_class_split_numbers():
    assert class_split("cars196", "retrieval", "train") == tuple(range(98))
    assert class_split("cars196", "retrieval", "test") == tuple(range(98, 196))
    assert class_split("caltech_birds2011", "retrieval", "train") == tuple(range(100))
    assert class_split("caltech_birds2011", "retrieval", "test") == tuple(range(100, 200))
    assert class_split("stanford_online_products", "retrieval", "train") == tuple(range(11318))
    assert class_split("stanford_online_products", "retrieval", "test") == tuple(range(11318, 22634))
    assert protocol_split("stanford_online_products", "retrieval", "test")[1] == "test"
    assert protocol_split("cars196", "retrieval", "test")[1] == "train+test"
    assert class_split("fashion_mnist", "retrieval", "test") == (5, 6, 7, 8, 9)
    assert class_split("fashion_mnist", "few_shot", "base") == (0, 1, 2, 3, 4)
    # CUB few-shot (Chen et al. 2019): 100 / 50 / 50, disjoint, covering the 200 classes
    cub = {p: set(class_split("caltech_birds2011", "few_shot", p)) for p in ("base", "val", "novel")}
    assert [len(cub[p]) for p in ("base", "val", "novel")] == [100, 50, 50]
    assert set().union(*cub.values()) == set(range(200))
    # FC100: every superclass holds 5 fine classes; 60 / 20 / 20 fine classes, disjoint
    assert np.bincount(CIFAR100_COARSE).tolist() == [5] * 20
    fc100 = {p: set(class_split("cifar100", "few_shot", p)) for p in FC100_SUPERCLASSES}
    assert [len(fc100[p]) for p in ("base", "val", "novel")] == [60, 20, 20]
    assert set().union(*fc100.values()) == set(range(100))
    for part, superclasses in FC100_SUPERCLASSES.items():
        assert {CIFAR100_COARSE[c] for c in fc100[part]} == set(superclasses)
    for name, protocols in CLASS_SPLITS.items():  # every part lies inside the label range, parts disjoint
        for parts in protocols.values():
            chosen = [set(classes) for classes, _ in parts.values()]
            assert sum(map(len, chosen)) == len(set().union(*chosen))


def test_fc100_matches_the_mock_coarse_labels_definition():
    """FC100's novel classes are those whose ``coarse_label`` is a novel superclass (the CIFAR-100 mapping)."""
    novel = class_split("cifar100", "few_shot", "novel")
    assert novel == tuple(c for c in range(100) if CIFAR100_COARSE[c] in (0, 7, 12, 14))
    assert (4, 30, 55, 72, 95) == tuple(c for c in range(100) if CIFAR100_COARSE[c] == 0)  # aquatic mammals


@pytest.mark.fashion_mnist
def test_fashion_mnist_split_keeps_or_remaps_labels():
    images, labels = load_fashion_mnist("test", limit=500)
    mask = labels >= 5  # the independent filter
    x, y = fashion_mnist_split("retrieval", "test", limit=500)
    np.testing.assert_array_equal(y, labels[mask])
    np.testing.assert_array_equal(x, images[mask])
    _, y_relabeled = fashion_mnist_split("few_shot", "novel", limit=500, relabel=True)
    np.testing.assert_array_equal(y_relabeled, labels[mask] - 5)
    train_images, train_labels = load_fashion_mnist("train", limit=300)
    x, y = fashion_mnist_split("few_shot", "base", limit=300)
    np.testing.assert_array_equal(y, train_labels[train_labels < 5])
    assert x.shape[1:] == (28, 28, 1) and x.dtype == np.float32
    legacy_x, legacy_y = select_classes(train_images, train_labels, range(5))
    np.testing.assert_array_equal(x, legacy_x)
    with pytest.raises(ValueError, match="`part` of the retrieval protocol of fashion_mnist must be one of"):
        fashion_mnist_split("retrieval", "novel")


def test_pipeline_feeds_a_backbone():
    """A fine-grained batch goes straight into a zoo backbone."""
    from zoo.backbones import backbone

    images, _ = next(iter(tfds_split_dataset("cars196", "retrieval", "train", 4, image_size=32)))
    features = backbone("small_convnet", (32, 32, 3), width=4, feature_dim=8)(images)
    assert tuple(features.shape) == (4, 8, 8, 8)
    assert isinstance(images, tf.Tensor)
