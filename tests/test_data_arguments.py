"""The data utilities' arguments: labels that batches would cast (1.7 -> 1, NaN -> -2**31, 2**40 -> 0), a
training pipeline with no batch (``fit`` trained on nothing without a word), fractional or negative seeds and pads
(truncated, or NumPy's error), a negative ``limit``, IDX files that are not the split they are named for, a
``$OTZOO_FASHION_MNIST`` folder that lacks the files (the other folders were read instead) and duplicate class
ids (a label left unused). Each is now one ``ValueError`` (or ``DataUnavailableError``) naming the argument."""
import gzip

import numpy as np
import pytest

from training.data import (ClassBalancedBatches, EpisodeBatches, EpisodeSampler, class_balanced_indices,
                           image_dataset, load_fashion_mnist, select_classes)
from training.data.arrays import ArrayBatches
from training.data.errors import DataUnavailableError
from training.data.fashion_mnist import fashion_mnist_dir

X = np.zeros((10, 8, 8, 1), np.uint8)
Y = np.arange(10) % 3
PIPELINES = {"ArrayBatches": ArrayBatches, "image_dataset": image_dataset}


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
@pytest.mark.parametrize("labels, message", [
    (Y + 0.7, r"`labels` must be integer class labels, got np.float64\(0.7\)"),
    (np.where(Y == 0, np.nan, Y), r"`labels` must be integer class labels, got np.float64\(nan\)"),
    (Y + 2 ** 40, "`labels` must lie in int32's range"),
    (Y.astype(str), "`labels` must be integer class labels, got an array of dtype <U"),
    (np.eye(3)[Y], r"shape \(N,\), got shape \(10, 3\); for one-hot labels pass their argmax"),
])
def test_labels_a_batch_would_cast_are_named(pipeline, labels, message):
    with pytest.raises(ValueError, match=message):
        PIPELINES[pipeline](X, labels, 4)


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_whole_float_and_column_labels_are_taken(pipeline):
    for labels in (Y.astype(np.float32), Y[:, None]):
        batches = PIPELINES[pipeline](X, labels, 5)
        got = np.concatenate([np.asarray(y).reshape(-1) for _, y in batches])
        np.testing.assert_array_equal(got, Y)


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
@pytest.mark.parametrize("kwargs, name", [
    (dict(batch_size=11, training=True), "batch_size"),
    (dict(batch_size=4, training=True, seed=1.7), "seed"),
    (dict(batch_size=4, training=True, seed=-1), "seed"),
    (dict(batch_size=4, training=True, pad=1.5), "pad"),
    (dict(batch_size=4, training="no"), "training"),
    (dict(batch_size=4, drop_remainder="no"), "drop_remainder"),
])
def test_batching_arguments_are_named(pipeline, kwargs, name):
    with pytest.raises(ValueError, match=f"^`{name}`"):
        PIPELINES[pipeline](X, Y, **kwargs)


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_a_batch_larger_than_the_data_is_kept_when_the_remainder_is(pipeline):
    assert len([1 for _ in PIPELINES[pipeline](X, Y, 11)]) == 1
    assert len([1 for _ in PIPELINES[pipeline](X, Y, 11, training=True, drop_remainder=False)]) == 1


@pytest.mark.parametrize("build, name", [
    (lambda: ClassBalancedBatches(np.zeros((40, 2)), np.eye(2)[np.arange(20) % 2], 2, 2, 1), "y"),
    (lambda: ClassBalancedBatches(X, np.where(Y == 0, np.nan, Y), 2, 2, 1), "y"),
    (lambda: ClassBalancedBatches(X, Y, 2, 2, 1, seed=1.7), "seed"),
    (lambda: EpisodeSampler(np.where(Y == 0, np.nan, Y), 2, 1, 1), "labels"),
    (lambda: EpisodeSampler(Y, 2, 1, 1, seed=None), "seed"),
    (lambda: load_fashion_mnist("test", limit=-5), "limit"),
    (lambda: load_fashion_mnist("test", limit=2.5), "limit"),
    (lambda: select_classes(X, Y, [1, 1, 2]), "classes"),
    (lambda: select_classes(X, Y, "12"), "classes"),
    (lambda: select_classes(X, Y, [1.5]), "classes"),
])
def test_sampler_and_loader_arguments_are_named(build, name):
    with pytest.raises(ValueError, match=f"^`{name}`"):
        build()


def _write_idx(path, array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("images, labels", [
    (np.zeros((4, 28, 28)), np.zeros(3)),  # counts differ
    (np.zeros((4, 28, 28)), np.zeros((4, 28, 28))),  # a labels file that holds images
    (np.zeros((4, 784)), np.zeros(4)),  # flat images
    (np.zeros((4, 28, 28)), np.full(4, 200)),  # labels outside 0..9
])
def test_idx_files_that_are_no_fashion_mnist_split_are_refused(images, labels, tmp_path, monkeypatch):
    for split, (image_file, label_file) in {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
                                            "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}.items():
        _write_idx(tmp_path / image_file, images)
        _write_idx(tmp_path / label_file, labels)
    monkeypatch.setenv("OTZOO_FASHION_MNIST", str(tmp_path))
    with pytest.raises(DataUnavailableError, match="are no Fashion-MNIST test split"):
        load_fashion_mnist("test")


@pytest.mark.parametrize("breakage, message", [
    ("not_gzip", "t10k-images-idx3-ubyte.gz is not a readable gzip file"),
    ("cut_stream", "t10k-images-idx3-ubyte.gz is not a readable gzip file"),
    ("float_idx", "t10k-images-idx3-ubyte.gz is not an unsigned-byte IDX file"),
    ("few_values", "t10k-images-idx3-ubyte.gz is truncated: expected 3136 values, found 784"),
    # extra bytes were reported as "truncated" too
    ("extra_values", r"t10k-images-idx3-ubyte.gz has the wrong size \(extra bytes after the data\): expected 3136 "
                     "values, found 3138"),
])
def test_a_broken_idx_file_is_named_with_the_way_to_repair_it(breakage, message, tmp_path, monkeypatch):
    """A damaged download gave gzip's or zlib's bare error (no file named) or a ValueError; now each is a
    DataUnavailableError naming the file and the reinstall command."""
    for image_file, label_file in [("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
                                   ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")]:
        _write_idx(tmp_path / image_file, np.zeros((4, 28, 28)))
        _write_idx(tmp_path / label_file, np.zeros(4))
    broken = tmp_path / "t10k-images-idx3-ubyte.gz"
    if breakage == "not_gzip":
        broken.write_bytes(b"plain bytes, no gzip header")
    elif breakage == "cut_stream":
        broken.write_bytes(broken.read_bytes()[:40])
    elif breakage == "float_idx":
        with gzip.open(broken, "wb") as handle:
            handle.write(bytes([0, 0, 0x0D, 1]) + (4).to_bytes(4, "big") + np.zeros(4, ">f4").tobytes())
    else:
        values = 784 if breakage == "few_values" else 3138
        with gzip.open(broken, "wb") as handle:
            handle.write(bytes([0, 0, 0x08, 3]) + b"".join(d.to_bytes(4, "big") for d in (4, 28, 28))
                         + bytes(values))
    monkeypatch.setenv("OTZOO_FASHION_MNIST", str(tmp_path))
    with pytest.raises(DataUnavailableError, match=message + ".*apt-get install --reinstall dataset-fashion-mnist"):
        load_fashion_mnist("test")


def test_a_fashion_mnist_folder_the_user_named_is_not_replaced_by_another(tmp_path, monkeypatch):
    (tmp_path / "t10k-images-idx3-ubyte.gz").write_bytes(b"")
    monkeypatch.setenv("OTZOO_FASHION_MNIST", str(tmp_path))
    with pytest.raises(DataUnavailableError, match=f"OTZOO_FASHION_MNIST={tmp_path} lacks .*train-images"):
        fashion_mnist_dir()


@pytest.mark.parametrize("kwargs, name", [
    ({"classes_per_batch": 2.5}, "classes_per_batch"),
    ({"classes_per_batch": 0}, "classes_per_batch"),
    ({"samples_per_class": -1}, "samples_per_class"),
    ({"samples_per_class": "4"}, "samples_per_class"),
    ({"rng": 7}, "rng"),
    ({"rng": np.random.RandomState(0)}, "rng"),
    ({"labels": np.array([0.5, 1.0, 2.0, 3.0])}, "labels"),
])
def test_class_balanced_indices_names_a_bad_argument(kwargs, name):
    """NumPy's own errors ("'float' object cannot be interpreted as an integer", "negative dimensions", "'int'
    object has no attribute 'choice'") named no argument; a fractional label was a class of its own."""
    from training.data.samplers import class_balanced_indices
    arguments = {"labels": np.arange(4), "classes_per_batch": 2, "samples_per_class": 2,
                 "rng": np.random.default_rng(0), **kwargs}
    with pytest.raises(ValueError, match=f"^`{name}`"):
        class_balanced_indices(**arguments)


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
def test_images_without_a_channel_axis_are_named(pipeline):
    """``(N, H, W)`` images passed the constructors and failed at the first batch in NumPy's or TensorFlow's words."""
    with pytest.raises(ValueError, match=r"^`images` must have shape \(N, H, W, C\), got shape \(10, 8, 8\) "
                                         r"\(add the channel axis"):
        PIPELINES[pipeline](X[..., 0], Y, 4, training=True)


def test_lists_column_labels_and_negative_episodes():
    """A list ``x`` (indexed by index arrays: TypeError at the first batch), ``(N, 1)`` labels in
    ``select_classes`` (IndexError; taken everywhere else) and a negative episode index (NumPy's words)."""
    from training.evaluation import evaluate_episodes

    labels = np.repeat(np.arange(4), 5)
    batches = ClassBalancedBatches(list(range(20)), labels, 2, 2, 1)
    x, y = batches[0]
    np.testing.assert_array_equal(labels[x], y)
    images, kept = select_classes(np.arange(20), labels[:, None], [2, 1])
    np.testing.assert_array_equal(images, np.arange(5, 15))
    np.testing.assert_array_equal(kept, [1] * 5 + [0] * 5)
    with pytest.raises(ValueError, match=r"^`index` must be an integer >= 0, got -1"):
        EpisodeSampler(labels, 2, 1, 1).episode(-1)
    features = [[float(label), 0.0] for label in labels]  # a list of feature rows
    nearest_mean = {"mean": lambda support, support_label, query: -np.abs(query[:, :1] - support[:, 0][None, :])}
    report = evaluate_episodes(features, labels, nearest_mean, ways=2, shots=1, queries=2, episodes=3)
    assert report["mean"]["mean"] == 1.0


@pytest.mark.parametrize("build, name", [
    (lambda labels: ClassBalancedBatches(np.zeros((len(labels), 2)), labels, 2, 2, 1), "y"),
    (lambda labels: class_balanced_indices(labels, 2, 2, np.random.default_rng(0)), "labels"),
    (lambda labels: EpisodeSampler(labels, 2, 1, 1), "labels"),
    (lambda labels: EpisodeBatches(np.zeros((len(labels), 4, 4, 1)), labels, 1, 2, 1, 1), "labels"),
], ids=["ClassBalancedBatches", "class_balanced_indices", "EpisodeSampler", "EpisodeBatches"])
def test_the_class_samplers_refuse_negative_labels(build, name):
    """-1 (the losses' and layers' unlabelled sample, which belongs to no class) was drawn as a class of its own:
    P x K batches and episode classes of unlabelled samples. The same labels shifted to 0.. are taken."""
    labels = np.repeat([-1, 0, 1], 4)
    with pytest.raises(ValueError, match=rf"^`{name}` must be class ids >= 0, got -1: .*unlabelled"):
        build(labels)
    with pytest.raises(ValueError, match=rf"^`{name}` must be class ids >= 0, got -2"):
        build(np.where(labels == -1, -2.0, labels))  # whole floats too
    build(labels + 1)
