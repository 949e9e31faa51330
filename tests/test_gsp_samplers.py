"""Class-balanced sampler: P classes x K samples, reproducible, usable in model.fit."""
import keras
import numpy as np
import pytest

from training.data.samplers import ClassBalancedBatches, class_balanced_indices


def test_batches_hold_p_classes_with_k_samples():
    labels = np.repeat(np.arange(10), [5, 5, 5, 5, 5, 5, 5, 5, 5, 2])
    x = np.arange(len(labels))[:, None].astype(np.float32)
    batches = ClassBalancedBatches(x, labels, classes_per_batch=4, samples_per_class=3, steps_per_epoch=20, seed=1)
    assert len(batches) == 20
    for i in range(len(batches)):
        xb, yb = batches[i]
        classes, counts = np.unique(yb, return_counts=True)
        assert len(classes) == 4 and np.all(counts == 3)
        np.testing.assert_array_equal(labels[xb[:, 0].astype(int)], yb)
        for c in classes:  # without replacement when the class is large enough
            if np.sum(labels == c) >= 3:
                assert len(np.unique(xb[yb == c, 0])) == 3


def test_reproducible_and_redrawn_each_epoch():
    labels = np.repeat(np.arange(6), 10)
    a = class_balanced_indices(labels, 3, 4, np.random.default_rng(7))
    b = class_balanced_indices(labels, 3, 4, np.random.default_rng(7))
    np.testing.assert_array_equal(a, b)
    batches = ClassBalancedBatches(labels[:, None], labels, 3, 4, steps_per_epoch=2, seed=0)
    first = batches[0][0].copy()
    batches.on_epoch_end()
    assert not np.array_equal(first, batches[0][0])


def test_rejects_bad_arguments():
    labels = np.repeat(np.arange(3), 4)
    with pytest.raises(ValueError, match="classes_per_batch"):
        ClassBalancedBatches(labels[:, None], labels, classes_per_batch=4, samples_per_class=2, steps_per_epoch=1)
    with pytest.raises(ValueError, match="samples_per_class"):
        ClassBalancedBatches(labels[:, None], labels, classes_per_batch=2, samples_per_class=0, steps_per_epoch=1)


def test_fit_accepts_the_sampler():
    labels = np.repeat(np.arange(4), 8)
    x = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4)])
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(ClassBalancedBatches(x, labels, 2, 4, steps_per_epoch=3), epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2
