"""Runs interrupted after an epoch and resumed with keras.callbacks.BackupAndRestore end like uninterrupted ones:
GSPPrototypeInit's warm-up and the class-balanced sampler's data order."""
import keras
import numpy as np
import pytest

from ot_layers import GeneralizedSumPooling
from ot_layers.callbacks import GSPPrototypeInit
from training.data.samplers import ClassBalancedBatches
from tests.resume_checks import RecordBatches, assert_same_weights, fit_interrupted_and_resumed, fit_uninterrupted


# ---- GSPPrototypeInit --------------------------------------------------------------------------------------

X = np.random.default_rng(0).uniform(size=(16, 5, 5, 3)).astype(np.float32)
Y = (np.arange(16) % 3).astype(np.int32)


def _gsp_setup():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5, 5, 3))
    features = keras.layers.Conv2D(6, 1, activation="relu", name="conv")(inputs)
    pooled = GeneralizedSumPooling(num_prototypes=4, max_iter=30, name="gsp")(features)
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(pooled), name="model")
    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    init = GSPPrototypeInit(X[:8], warmup_epochs=2, num_features=60, seed=1)
    return model, {"x": X, "y": Y, "batch_size": 8, "shuffle": False}, [init]


@pytest.fixture(scope="module")
def gsp_reference():
    reference, _ = fit_uninterrupted(_gsp_setup, epochs=3)
    # the warm-up and the initialization matter: a run without the callback ends elsewhere
    model, fit_kwargs, _ = _gsp_setup()
    model.fit(**fit_kwargs, epochs=3, verbose=0)
    assert not np.allclose(np.asarray(model.get_layer("gsp").prototypes),
                           np.asarray(reference.get_layer("gsp").prototypes), atol=1e-3)
    return reference


@pytest.mark.parametrize("interrupt_after", [0, 1])  # during the warm-up; right after the initialization
def test_gsp_prototype_init_resume_equals_uninterrupted_run(gsp_reference, interrupt_after, tmp_path):
    resumed, (init,) = fit_interrupted_and_resumed(_gsp_setup, 3, interrupt_after, tmp_path / "backup")
    assert_same_weights(gsp_reference, resumed)
    gsp = resumed.get_layer("gsp")
    assert init.initialized and float(gsp.warmup_epochs_done.numpy()) == 2.0
    assert float(gsp.average_pooling_warmup.numpy()) == 0.0


# ---- ClassBalancedBatches ----------------------------------------------------------------------------------

LABELS = np.repeat(np.arange(5), 6)
FEATURES = np.random.default_rng(1).normal(size=(30, 4)).astype(np.float32)


def _sampler_setup():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, name="dense")], name="model")
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batches = ClassBalancedBatches(FEATURES, LABELS, classes_per_batch=2, samples_per_class=3, steps_per_epoch=4,
                                   seed=7)
    return model, {"x": batches, "shuffle": False}, [batches.epoch_callback(), RecordBatches(batches)]


@pytest.mark.parametrize("interrupt_after", [0, 2])
def test_class_balanced_batches_resume_equals_uninterrupted_run(interrupt_after, tmp_path):
    reference, _ = fit_uninterrupted(_sampler_setup, epochs=4)
    resumed, (_, record) = fit_interrupted_and_resumed(_sampler_setup, 4, interrupt_after, tmp_path / "backup")
    assert_same_weights(reference, resumed)
    # the resumed run served the batches of fit's epochs, not a restarted sequence
    assert record.epochs == [(e, e) for e in range(interrupt_after + 1, 4) for _ in range(4)]


def test_class_balanced_batches_are_a_function_of_seed_and_epoch():
    a = ClassBalancedBatches(FEATURES, LABELS, 2, 3, steps_per_epoch=4, seed=7)
    b = ClassBalancedBatches(FEATURES, LABELS, 2, 3, steps_per_epoch=4, seed=7)
    for _ in range(3):
        a.on_epoch_end()
    b.set_epoch(3)
    for i in range(4):
        np.testing.assert_array_equal(a[i][0], b[i][0])
    rng = np.random.default_rng([7, 3])
    from training.data.samplers import class_balanced_indices
    for i in range(4):
        np.testing.assert_array_equal(b.batches[i], class_balanced_indices(LABELS, 2, 3, rng))
