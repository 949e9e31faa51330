"""``training.data.arrays.ArrayBatches``: the NumPy batches the recipes read on JAX and PyTorch.

Each augmented image is checked against its source, recovered through its label (the labels are the sample
indices): it must be a window of the zero-padded source, possibly mirrored. The orders are permutations,
reproducible from the seed and new every epoch; ``map`` composes feeds as ``tf.data`` does; ``model.predict`` and
``model.fit`` read them.
"""
import keras
import numpy as np
import pytest

from training.data.arrays import ArrayBatches, pad_crop_flip_batch
from training.data.samplers import ClassBalancedBatches
from training.data.pipelines import array_batches, batch_labels
from tests.resume_checks import RecordBatches, assert_same_weights, fit_interrupted_and_resumed, fit_uninterrupted


def _images(n=50, side=6, channels=2):
    rng = np.random.default_rng(7)
    return rng.integers(1, 256, size=(n, side, side, channels)).astype(np.uint8), np.arange(n)


def _windows(source, pad):
    """Every pad-crop(-flip) of ``source``."""
    padded = np.pad(source.astype(np.float32), [(pad, pad), (pad, pad), (0, 0)])
    side = source.shape[0]
    for row in range(2 * pad + 1):
        for col in range(2 * pad + 1):
            crop = padded[row:row + side, col:col + side]
            yield (row, col, False), crop
            yield (row, col, True), crop[:, ::-1]


def test_evaluation_batches_are_the_arrays_in_order():
    images, labels = _images()
    batches = ArrayBatches(images, labels, 16)
    assert len(batches) == 4  # 16 + 16 + 16 + 2: nothing dropped
    x = np.concatenate([batch[0] for batch in batches])
    assert x.dtype == np.float32 and np.array_equal(x, images.astype(np.float32))
    assert batches[0][1].dtype == np.int32 and np.array_equal(batch_labels(batches), labels)
    with pytest.raises(IndexError):
        batches[4]


def test_training_batches_are_padded_crops_and_flips_of_their_sources():
    images, labels = _images()
    pad = 2
    batches = ArrayBatches(images, labels, 16, training=True, pad=pad, seed=3)
    assert len(batches) == 3  # the incomplete batch dropped
    seen, draws = [], []
    for x, y in batches:
        for image, index in zip(x, y):
            matches = [draw for draw, window in _windows(images[index], pad) if np.array_equal(window, image)]
            assert matches, f"image of sample {index} is no window of its padded source"
            draws.append(matches[0])
        seen.extend(y.tolist())
    assert len(set(seen)) == len(seen) == 48  # a permutation, 48 of the 50 samples
    assert len({draw[:2] for draw in draws}) > 10 and {draw[2] for draw in draws} == {False, True}


def test_pad_crop_flip_draws_cover_every_offset_and_flip_half_the_time():
    """A 3 x 3 image marked at its corner, padded by 1: the corner stays in the window for 4 of the 9 offsets, at
    column 1 - c for column offset c (c in {0, 1}) and at 1 + c when mirrored; uniform offsets and fair flips put it
    in columns 0, 1, 2 a quarter, a half and a quarter of the time."""
    x = np.zeros((4000, 3, 3, 1), np.float32)
    x[:, 0, 0, 0] = 1.0
    out = pad_crop_flip_batch(x, 1, np.random.default_rng(0))
    visible = out[:, :, :, 0].sum(axis=(1, 2))
    assert out.shape == x.shape and set(np.unique(visible)) <= {0.0, 1.0}
    assert abs(np.mean(visible) - 4 / 9) < 0.05
    columns = np.argwhere(out[:, :, :, 0] == 1.0)[:, 2]
    assert np.allclose(np.bincount(columns, minlength=3) / len(columns), [0.25, 0.5, 0.25], atol=0.05)


def test_orders_follow_the_seed_and_change_every_epoch():
    images, labels = _images()

    def epochs(seed, count=3):
        batches = ArrayBatches(images, labels, 10, training=True, seed=seed)
        orders = []
        for _ in range(count):
            orders.append(np.concatenate([y for _, y in batches]))
            batches.on_epoch_end()
        return orders

    first, again, other = epochs(0), epochs(0), epochs(1)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[0], first[1]) and not np.array_equal(first[0], other[0])


def test_set_epoch_serves_the_batches_of_that_epoch():
    images, labels = _images()
    served = ArrayBatches(images, labels, 10, training=True, seed=5)
    for _ in range(3):
        served.on_epoch_end()
    jumped = ArrayBatches(images, labels, 10, training=True, seed=5)
    jumped.set_epoch(3)
    assert served.epoch == jumped.epoch == 3
    for i in range(len(served)):
        for a, b in zip(served[i], jumped[i]):
            np.testing.assert_array_equal(a, b)


def _array_setup():
    keras.utils.set_random_seed(0)
    images, labels = _images(n=48, side=4, channels=1)
    model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(48, name="dense")],
                             name="model")
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batches = ArrayBatches(images, labels, 12, training=True, seed=2)
    return model, {"x": batches, "shuffle": False}, [batches.epoch_callback(), RecordBatches(batches)]


@pytest.mark.parametrize("interrupt_after", [0, 1])
def test_a_resumed_run_trains_on_the_batches_of_an_uninterrupted_one(interrupt_after, tmp_path):
    """Interrupted after an epoch and resumed from ``BackupAndRestore`` in a fresh model and a fresh ``ArrayBatches``
    (what a new process builds), the run serves ``fit``'s epochs and ends with the uninterrupted run's weights."""

    reference, _ = fit_uninterrupted(_array_setup, epochs=3)
    resumed, (_, record) = fit_interrupted_and_resumed(_array_setup, 3, interrupt_after, tmp_path / "backup")
    assert record.epochs == [(e, e) for e in range(interrupt_after + 1, 3) for _ in range(4)]
    assert_same_weights(reference, resumed)


def test_map_composes_feeds_and_model_reads_the_batches():
    images, labels = _images(n=40, side=4, channels=1)
    batches = ArrayBatches(images, labels, 8).map(lambda x, y: ((x, y), y)).map(lambda xy, y: (xy[0] * 2, y))
    x, y = batches[1]
    assert np.array_equal(x, 2 * images[8:16].astype(np.float32)) and np.array_equal(y, labels[8:16])
    model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(40)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ArrayBatches(images, labels, 8, training=True, augment="none"), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
    assert model.predict(ArrayBatches(images, labels, 8).map(lambda x, y: x), verbose=0).shape == (40, 40)


def test_bad_input_names_the_argument():
    images, labels = _images()
    with pytest.raises(ValueError, match="`labels` has 49"):
        ArrayBatches(images, labels[:49], 8)
    with pytest.raises(ValueError, match="`images` is empty"):
        ArrayBatches(images[:0], labels[:0], 8)
    with pytest.raises(ValueError, match="recipe field `augment`"):
        ArrayBatches(images, labels, 8, augment="mixup")
    with pytest.raises(ValueError, match="batch_size"):
        ArrayBatches(images, labels, 0)


def test_the_tensorflow_backend_keeps_tf_data():
    """The recipes read ``tf.data`` on TensorFlow (the published presets' pipeline) and ``ArrayBatches`` elsewhere."""
    images, labels = _images()
    batches = array_batches(images, labels, 16)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        assert isinstance(batches, tf.data.Dataset)
    else:
        assert isinstance(batches, ArrayBatches)
    assert np.array_equal(batch_labels(batches), labels)


def test_the_tf_data_augmentation_is_drawn_anew_every_epoch_and_seeded():
    """``image_dataset`` drew its per-position crop-and-flip seeds once: position j of every epoch got the same
    placement, so over 40 passes each image showed at most 3 of its 50 placements (one per position). The draws now
    change every epoch, and a fresh pipeline with the same seed still repeats them."""
    from training.data.pipelines import image_dataset

    images, labels = _images(n=3, side=4, channels=1)
    pad, passes = 2, 40

    def placements(dataset):
        found = [[] for _ in labels]
        for _ in range(passes):
            for x, y in dataset:
                image, index = x.numpy()[0], int(y.numpy()[0])
                found[index].append(next(draw for draw, window in _windows(images[index], pad)
                                         if np.array_equal(window, image)))
        return found

    first = placements(image_dataset(images, labels, 1, training=True, pad=pad, seed=4))
    assert all(len(set(draws)) > 10 for draws in first), [len(set(draws)) for draws in first]
    again = placements(image_dataset(images, labels, 1, training=True, pad=pad, seed=4))
    assert again == first


def _seeded_batches(kind, **kwargs):
    """A training ``ArrayBatches`` (5 batches) or ``ClassBalancedBatches`` (4 batches), seeded, that records
    ``(fit's epoch, index, labels)`` of every batch it serves, ``fit's epoch`` read off ``batches.fit_epoch``."""
    images, labels = _images(n=30, side=4, channels=1)
    labels = labels % 5

    class Recorded(ArrayBatches if kind == "ArrayBatches" else ClassBalancedBatches):
        def __getitem__(self, index):
            batch = super().__getitem__(index)
            self.served.append((self.fit_epoch, index, np.asarray(batch[1])))
            return batch

    if kind == "ArrayBatches":
        batches = Recorded(images, labels, 6, training=True, seed=2, **kwargs)
    else:
        batches = Recorded(images, labels, 2, 3, steps_per_epoch=4, seed=2, **kwargs)
    batches.served, batches.fit_epoch = [], None
    return batches


def _expected_labels(kind, epoch):
    """The labels of the batches of ``epoch``, as fresh ``_seeded_batches(kind)`` serve them after ``set_epoch``."""
    fresh = _seeded_batches(kind)
    fresh.set_epoch(epoch)
    return [np.asarray(fresh[i][1]) for i in range(len(fresh))]


class _FitEpoch(keras.callbacks.Callback):
    """Tells the recording batches the epoch fit is in (None outside one: the batches Keras reads to build)."""

    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def on_epoch_begin(self, epoch, logs=None):
        self.batches.fit_epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        self.batches.fit_epoch = None


@pytest.mark.parametrize("kind", ["ArrayBatches", "ClassBalancedBatches"])
@pytest.mark.parametrize("with_callback", [False, True], ids=["plain_fit", "epoch_callback"])
def test_fit_trains_its_epoch_e_on_the_batches_of_epoch_e(kind, with_callback):
    """Keras reads a batch or two to build the model and calls ``on_epoch_end`` before the first epoch; a plain
    ``fit`` then trained its epoch e on the batches of epoch e + 1 and never saw epoch 0's. Also a second ``fit``
    that continues the first (``initial_epoch``) serves the epochs it trains."""
    batches = _seeded_batches(kind)
    model = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Flatten(), keras.layers.Dense(5)])
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [_FitEpoch(batches)] + ([batches.epoch_callback()] if with_callback else [])
    model.fit(batches, epochs=3, shuffle=False, verbose=0, callbacks=callbacks)
    model.fit(batches, initial_epoch=3, epochs=5, shuffle=False, verbose=0, callbacks=callbacks)
    for epoch in range(5):
        served = [(index, labels) for fit_epoch, index, labels in batches.served if fit_epoch == epoch]
        assert [index for index, _ in served] == list(range(len(batches)))
        for (_, labels), expected in zip(served, _expected_labels(kind, epoch)):
            np.testing.assert_array_equal(labels, expected, err_msg=f"fit epoch {epoch}")


@pytest.mark.parametrize("kind", ["ArrayBatches", "ClassBalancedBatches"])
def test_the_keras_epoch_calls_of_every_backend_serve_epoch_zero_first(kind):
    """The calls Keras makes on JAX and PyTorch (begin, one batch to build the model, end, then the epochs) and on
    TensorFlow (two batches to build, end without begin), and ``fit``'s ``steps_per_epoch`` shorter than a pass:
    the epoch advances once per complete pass. A direct ``on_epoch_end`` still advances."""
    for build in (lambda b: (b.on_epoch_begin(), b[0], b.on_epoch_end()), lambda b: (b[0], b[1], b.on_epoch_end())):
        batches = _seeded_batches(kind)
        build(batches)
        for epoch in range(2):
            batches.on_epoch_begin()
            assert batches.epoch == epoch
            for index in range(len(batches)):
                np.testing.assert_array_equal(batches[index][1], _expected_labels(kind, epoch)[index])
            batches.on_epoch_end()
    batches = _seeded_batches(kind)  # one batch per fit epoch: a pass ends every len(batches) fit epochs
    for step in range(2 * len(batches)):
        batches.on_epoch_begin()
        assert batches.epoch == step // len(batches)
        batches[step % len(batches)]
        batches.on_epoch_end()
    assert batches.epoch == 2
    batches.on_epoch_end()
    batches.on_epoch_end()
    assert batches.epoch == 4
