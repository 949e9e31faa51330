"""DL2PA: prototype estimation, Hungarian assignment, HypersphericalPrototypes layer, pull loss, re-assignment."""
import itertools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment

from ot_layers import HypersphericalPrototypes
from ot_layers.callbacks import PrototypeReassignment
from ot_layers.losses import HypersphericalPullLoss
from ot_layers.solvers import estimate_prototypes, hungarian_assignment
from ot_layers.solvers.prototypes import uniformity_loss_and_gradient
from tests import keras_checks

K, DIM, IN = 5, 4, 6


# --- prototype estimation -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("k,d", [(3, 2), (5, 4), (10, 9), (10, 16), (20, 19)])
def test_prototypes_form_simplex_etf_when_dim_at_least_k_minus_1(k, d):
    p = estimate_prototypes(k, d, file_cache=False)
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-5)
    cos = p @ p.T
    off = cos[~np.eye(k, dtype=bool)]
    assert abs(off.max() - (-1.0 / (k - 1))) <= 0.01, off.max()


def test_uniformity_gradient_matches_autodiff():
    p = np.random.default_rng(1).standard_normal((7, 3))
    loss, grad = uniformity_loss_and_gradient(p, 2.0)
    tp = tf.Variable(p)
    with tf.GradientTape() as tape:
        diff = tp[:, None, :] - tp[None, :, :]
        sq = tf.reduce_sum(diff * diff, -1)
        mask = 1.0 - tf.eye(7, dtype=tf.float64)
        tf_loss = tf.math.log(tf.reduce_sum(tf.exp(-2.0 * sq) * mask) / (7 * 6))
    np.testing.assert_allclose(loss, tf_loss.numpy(), rtol=1e-10)
    np.testing.assert_allclose(grad, tape.gradient(tf_loss, tp).numpy(), rtol=1e-8, atol=1e-12)


def test_prototypes_lower_the_uniformity_loss_and_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    p = estimate_prototypes(12, 3, steps=200, seed=3)
    start = np.random.default_rng(3).standard_normal((12, 3))
    start /= np.linalg.norm(start, axis=1, keepdims=True)
    assert uniformity_loss_and_gradient(p, 2.0)[0] < uniformity_loss_and_gradient(start, 2.0)[0] - 0.1
    files = list((tmp_path / "otzoo" / "prototypes").iterdir())
    assert len(files) == 1
    np.testing.assert_array_equal(np.load(files[0]), p)
    p[0] = 0.0  # callers get copies: the cache is not corrupted
    np.testing.assert_array_equal(estimate_prototypes(12, 3, steps=200, seed=3), np.load(files[0]))
    assert not np.allclose(estimate_prototypes(12, 3, steps=200, seed=4, file_cache=False), np.load(files[0]))


@pytest.mark.parametrize("kwargs,name", [({"num_classes": 1, "dim": 3}, "num_classes"),
                                         ({"num_classes": 4, "dim": 0}, "dim"),
                                         ({"num_classes": 4, "dim": 3, "t": -1.0}, "t"),
                                         ({"num_classes": 4, "dim": 3, "steps": 0}, "steps")])
def test_prototypes_reject_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        estimate_prototypes(**kwargs)


# --- Hungarian assignment -----------------------------------------------------------------------------------------
def _brute_force_best(similarity):
    k = similarity.shape[0]
    return max(similarity[np.arange(k), list(perm)].sum() for perm in itertools.permutations(range(k)))


@settings(max_examples=10, deadline=None)
@given(k=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_hungarian_matches_brute_force(k, seed):
    s = np.random.default_rng(seed).standard_normal((k, k))
    sigma = hungarian_assignment(s)
    assert sorted(sigma.tolist()) == list(range(k))
    np.testing.assert_allclose(s[np.arange(k), sigma].sum(), _brute_force_best(s), rtol=1e-12)


def test_hungarian_rejects_bad_input():
    with pytest.raises(ValueError, match="similarity"):
        hungarian_assignment(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="similarity"):
        hungarian_assignment(np.full((2, 2), np.nan))


def _layer_with_random_representatives(k, d, seed):
    layer = HypersphericalPrototypes(k, d, prototype_steps=50)
    layer.build((None, d))
    reps = np.random.default_rng(seed).standard_normal((k, d)).astype(np.float32)
    layer.representatives.assign(reps / np.linalg.norm(reps, axis=1, keepdims=True))
    return layer


@settings(max_examples=8, deadline=None)
@given(k=st.integers(2, 6), seed=st.integers(0, 10_000))
def test_callback_assignment_is_the_brute_force_optimum(k, seed):
    layer = _layer_with_random_representatives(k, 3, seed)
    PrototypeReassignment().reassign(layer)
    sigma = np.asarray(layer.assignment)
    cos = np.asarray(layer.representatives, np.float64) @ np.asarray(layer.prototypes, np.float64).T
    np.testing.assert_allclose(cos[np.arange(k), sigma].sum(), _brute_force_best(cos), rtol=1e-6)


def test_callback_assignment_equals_scipy_on_random_matrices():
    layer = _layer_with_random_representatives(30, 8, 0)
    changed = PrototypeReassignment().reassign(layer)
    cos = np.asarray(layer.representatives, np.float64) @ np.asarray(layer.prototypes, np.float64).T
    rows, cols = linear_sum_assignment(cos, maximize=True)
    np.testing.assert_array_equal(np.asarray(layer.assignment)[rows], cols)
    assert changed == int(np.sum(cols != rows))


# --- the layer and the loss ---------------------------------------------------------------------------------------
def test_logits_are_cosines_to_assigned_prototypes_and_ema_updates():
    layer = HypersphericalPrototypes(K, DIM, momentum=0.9)
    z = np.random.default_rng(0).standard_normal((8, DIM)).astype(np.float32)
    labels = np.array([0, 0, 1, 3, 3, 3, 1, 0], np.int32)
    layer(z)  # build
    perm = np.array([2, 0, 4, 1, 3], np.int32)
    layer.assignment.assign(perm)
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    p = np.asarray(layer.prototypes)
    np.testing.assert_allclose(layer(z), zn @ p[perm].T, atol=1e-6)
    assert not np.any(np.asarray(layer.representatives))  # inference: no update
    old = np.random.default_rng(1).standard_normal((K, DIM)).astype(np.float32)
    layer.representatives.assign(old)
    layer(z, labels=labels, training=True)
    expected = old.copy()
    for c in (0, 1, 3):
        v = 0.9 * old[c] + 0.1 * zn[labels == c].mean(0)
        expected[c] = v / np.linalg.norm(v)
    np.testing.assert_allclose(layer.representatives, expected, atol=1e-6)


def test_pull_loss_is_squared_cosine_gap():
    logits = np.array([[0.5, -0.2, 0.1], [0.9, 0.3, -1.0]], np.float32)
    loss = HypersphericalPullLoss()(np.array([1, 0]), logits)
    np.testing.assert_allclose(loss, ((1 + 0.2) ** 2 + (1 - 0.9) ** 2) / 2, rtol=1e-6)


@pytest.mark.parametrize("kwargs,name", [({"num_classes": 1}, "num_classes"), ({"dim": 0}, "dim"),
                                         ({"momentum": 1.0}, "momentum"), ({"prototype_steps": 0}, "prototype_steps")])
def test_layer_rejects_bad_arguments(kwargs, name):
    args = {"num_classes": K, "dim": DIM, **kwargs}
    with pytest.raises(ValueError, match=name):
        HypersphericalPrototypes(**args)


def test_layer_rejects_wrong_feature_dim():
    with pytest.raises(ValueError, match="dim"):
        HypersphericalPrototypes(K, DIM)(np.zeros((2, DIM + 1), np.float32))


# --- models and Keras checks --------------------------------------------------------------------------------------
def _data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n).astype(np.int32)
    x = (rng.standard_normal((n, IN)) + 2.0 * np.eye(K, IN)[y]).astype(np.float32)
    return x, y


def build_training_model():
    x = keras.Input((IN,), name="x")
    y = keras.Input((), dtype="int32", name="y")
    features = keras.layers.Dense(DIM, name="embed")(x)
    logits = HypersphericalPrototypes(K, DIM, name="protos")(features, labels=y)
    return keras.Model([x, y], logits)


def inference_model(model):
    """The label-free model sharing the training model's layers (what is exported)."""
    x = keras.Input((IN,), name="x")
    return keras.Model(x, model.get_layer("protos")(model.get_layer("embed")(x)))


def test_save_load_roundtrip_keeps_assignment(tmp_path):
    x, y = _data()
    model = build_training_model()
    model.compile(optimizer="adam", loss=HypersphericalPullLoss())
    model.fit([x, y], y, epochs=2, batch_size=8, verbose=0, callbacks=[PrototypeReassignment()])
    layer = model.get_layer("protos")
    layer.assignment.assign(np.array([3, 1, 4, 0, 2], np.int32))
    restored = keras_checks.assert_save_load_roundtrip(model, [x, y], tmp_path)
    for name in ("assignment", "representatives", "prototypes"):
        np.testing.assert_array_equal(getattr(restored.get_layer("protos"), name), getattr(layer, name))


def test_fits_with_xla_and_updates_representatives():
    x, y = _data()
    model = keras_checks.assert_fits_with_xla(build_training_model, [x, y], y, HypersphericalPullLoss())
    reps = np.asarray(model.get_layer("protos").representatives)
    np.testing.assert_allclose(np.linalg.norm(reps, axis=1), 1.0, atol=1e-5)


def test_fits_mirrored_and_updates_representatives():
    x, y = _data()
    model = keras_checks.assert_fits_mirrored(build_training_model, [x, y], y, HypersphericalPullLoss())
    reps = np.asarray(model.get_layer("protos").representatives)
    assert np.all(np.linalg.norm(reps, axis=1) > 0.9)
    PrototypeReassignment().reassign(model.get_layer("protos"))  # cross-replica assign works
    assert sorted(np.asarray(model.get_layer("protos").assignment).tolist()) == list(range(K))


def test_mixed_precision():
    x, y = _data()
    ref = build_training_model()
    keras_checks.assert_mixed_precision(build_training_model, [x, y], float32_model=ref)


def test_export_parity_predicts_same_labels(tmp_path):
    x, y = _data()
    model = build_training_model()
    model.compile(optimizer="adam", loss=HypersphericalPullLoss())
    model.fit([x, y], y, epochs=1, batch_size=8, verbose=0)
    model.get_layer("protos").assignment.assign(np.array([4, 2, 0, 1, 3], np.int32))
    infer = inference_model(model)
    report = keras_checks.assert_export_parity(infer, x, tmp_path)
    assert set(report) == {"saved_model", "onnx"}
    sm = tf.saved_model.load(os.path.join(str(tmp_path), "saved_model"))
    exported = np.asarray(sm.serve(tf.constant(x)))
    np.testing.assert_array_equal(exported.argmax(1), np.asarray(infer(x)).argmax(1))


def test_reassignment_logs_and_survives_checkpoint_resume(tmp_path):
    x, y = _data(64)
    ckpt = os.path.join(str(tmp_path), "ckpt.keras")
    model = build_training_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=HypersphericalPullLoss())
    model.get_layer("protos").assignment.assign(np.array([1, 2, 3, 4, 0], np.int32))  # start from a bad map
    reassign = PrototypeReassignment()
    history = model.fit([x, y], y, epochs=2, batch_size=16, verbose=0,
                        callbacks=[reassign, keras.callbacks.ModelCheckpoint(ckpt)])
    assert history.history["prototype_changes"] == reassign.changes
    assert reassign.changes[0] > 0
    saved = np.asarray(model.get_layer("protos").assignment)

    resumed = keras.saving.load_model(ckpt)  # a new model object, as after a restart
    np.testing.assert_array_equal(resumed.get_layer("protos").assignment, saved)
    np.testing.assert_array_equal(resumed.get_layer("protos").representatives,
                                  model.get_layer("protos").representatives)
    # continue both for one more epoch with the same data order: same assignment
    more = dict(epochs=3, initial_epoch=2, batch_size=16, verbose=0, shuffle=False)
    model.fit([x, y], y, callbacks=[PrototypeReassignment()], **more)
    resumed.fit([x, y], y, callbacks=[PrototypeReassignment()], **more)
    np.testing.assert_array_equal(resumed.get_layer("protos").assignment, model.get_layer("protos").assignment)
    # and a weights-only checkpoint restores the assignment into a freshly built model
    weights = os.path.join(str(tmp_path), "w.weights.h5")
    model.save_weights(weights)
    fresh = build_training_model()
    fresh.load_weights(weights)
    np.testing.assert_array_equal(fresh.get_layer("protos").assignment, model.get_layer("protos").assignment)


def test_callback_finds_layer_by_name_or_refuses():
    x, y = _data()
    model = build_training_model()
    model.compile(optimizer="adam", loss=HypersphericalPullLoss())
    with pytest.raises(ValueError, match="HypersphericalPrototypes"):
        model.fit([x, y], y, epochs=1, verbose=0, callbacks=[PrototypeReassignment(layer_name="nope")])
    with pytest.raises(ValueError, match="frequency"):
        PrototypeReassignment(frequency=0)


def test_batch_frequency_reassigns_within_the_epoch():
    x, y = _data(64)
    model = build_training_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=HypersphericalPullLoss())
    model.get_layer("protos").assignment.assign(np.array([1, 2, 3, 4, 0], np.int32))
    calls = []
    reassign = PrototypeReassignment(frequency=5, batch_frequency=2)
    original = reassign.reassign
    reassign.reassign = lambda layer: calls.append(1) or original(layer)
    history = model.fit([x, y], y, epochs=1, batch_size=16, verbose=0, callbacks=[reassign])
    assert len(calls) == 2  # batches 2 and 4 of 4; epoch 1 is not a multiple of frequency=5
    assert history.history["prototype_changes"] == reassign.changes and reassign.changes[0] > 0
    with pytest.raises(ValueError, match="batch_frequency"):
        PrototypeReassignment(batch_frequency=0)
