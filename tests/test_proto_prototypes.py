"""DL2PA: prototype estimation, Hungarian assignment, HypersphericalPrototypes layer, pull loss, re-assignment."""
import inspect
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
from ot_layers.solvers import estimate_prototypes, hungarian_assignment, simplex_etf
from ot_layers.solvers.prototypes import max_pairwise_cosine, uniformity_loss_and_gradient
from tests import keras_checks
from tests.gradient_checks import run_with_a_bad_sample
from tests.resume_checks import Interrupt

K, DIM, IN = 5, 4, 6


# --- prototype estimation -----------------------------------------------------------------------------------------
def _cosines(p):
    p = np.asarray(p, np.float64)
    return (p @ p.T)[~np.eye(len(p), dtype=bool)]


@pytest.mark.parametrize("k", [2, 3, 10, 100, 999, 1000])
@pytest.mark.parametrize("extra", [0, 6])
def test_prototypes_are_the_simplex_etf_when_dim_at_least_k_minus_1(k, extra):
    d = k - 1 + extra
    p = estimate_prototypes(k, d, seed=3)
    assert p.shape == (k, d) and p.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-6)
    # closed form: the Gram matrix of a simplex ETF is (K I - 11') / (K - 1)
    gram = np.asarray(p, np.float64) @ np.asarray(p, np.float64).T
    np.testing.assert_allclose(gram, (k * np.eye(k) - np.ones((k, k))) / (k - 1), atol=5e-6)  # float32 rows
    cos = _cosines(p)
    assert abs(cos.max() + 1.0 / (k - 1)) <= 1e-4 and abs(cos.min() + 1.0 / (k - 1)) <= 1e-4


def test_etf_is_deterministic_given_the_seed_and_uses_every_coordinate():
    a, b, c = estimate_prototypes(10, 12, seed=1), estimate_prototypes(10, 12, seed=1), simplex_etf(10, 12, seed=2)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)  # another orientation of the same frame
    np.testing.assert_allclose(c @ c.T, a.astype(np.float64) @ a.T, atol=1e-6)
    assert np.all(np.abs(a).max(axis=0) > 1e-3)  # embedded by a rotation, not zero-padded


@pytest.mark.parametrize("k,d,best_known", [(12, 3, 1.0 / np.sqrt(5.0)),  # the icosahedron (Tammes, proven)
                                            (24, 4, 0.5)])  # the 24-cell
def test_prototypes_reach_the_best_known_spherical_codes(k, d, best_known):
    p = estimate_prototypes(k, d)
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, atol=1e-6)
    worst = _cosines(p).max()
    assert worst <= best_known + 0.01, worst
    if k == 12:
        assert worst >= best_known - 1e-5  # the Tammes optimum for 12 points cannot be beaten
    np.testing.assert_array_equal(estimate_prototypes(k, d), p)  # deterministic given the seed


def test_max_cosine_beats_the_papers_uniformity_loss_and_tracks_it():
    # the uniformity loss of Saadabadi et al. 2024 at its fixed t = 2, minimized by plain projected gradient
    # descent, vs the annealed max-cosine optimizer: the latter's largest cosine is no worse (10 points in R^3)
    rng = np.random.default_rng(0)
    p = rng.standard_normal((10, 3))
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    for _ in range(500):
        p -= 0.1 * uniformity_loss_and_gradient(p, 2.0)[1]
        p /= np.linalg.norm(p, axis=1, keepdims=True)
    assert max_pairwise_cosine(estimate_prototypes(10, 3)) <= _cosines(p).max() + 1e-6
    assert max_pairwise_cosine(p) == pytest.approx(_cosines(p).max(), abs=1e-12)


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


def test_prototypes_write_nothing_and_callers_get_copies(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    p = estimate_prototypes(7, 3, seed=3)
    assert list(tmp_path.iterdir()) == []
    p[0] = 0.0  # callers get copies: the in-process memo is not corrupted
    assert np.all(np.linalg.norm(estimate_prototypes(7, 3, seed=3), axis=1) > 0.99)


@pytest.mark.parametrize("kwargs,name", [({"num_classes": 1, "dim": 3}, "num_classes"),
                                         ({"num_classes": 4, "dim": 0}, "dim"),
                                         ({"num_classes": 4, "dim": 2, "steps": 0}, "steps"),
                                         ({"num_classes": 4, "dim": 2, "restarts": 0}, "restarts")])
def test_prototypes_reject_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        estimate_prototypes(**kwargs)
    with pytest.raises(ValueError, match="dim"):
        simplex_etf(5, 3)


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
    layer = HypersphericalPrototypes(k, d, prototypes=np.random.default_rng(seed + 1).standard_normal((k, d)))
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


def test_pull_loss_of_a_label_outside_the_classes_is_zero():
    """-1 (an unlabelled sample) or K contributes nothing, as the layer leaves such samples out; a gather took the
    last class's cosine for -1 and raised for K."""
    logits = np.array([[0.5, -0.2, 0.1], [0.9, 0.3, -1.0], [0.2, 0.3, 0.8]], np.float32)
    per_sample = HypersphericalPullLoss(reduction=None)(np.array([1, -1, 3]), logits)
    np.testing.assert_allclose(per_sample, [(1 + 0.2) ** 2, 0.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize("shape", [(3, 4, 2), (3,)])
def test_pull_loss_names_y_pred_of_the_wrong_rank(shape):
    """Rank 3 failed in a TensorFlow SelectV2 broadcast, rank 1 with an IndexError."""
    with pytest.raises(ValueError, match=r"^`y_pred` of HypersphericalPullLoss must be the \(B, num_classes\) "
                                         rf"cosine logits .*got shape \({', '.join(map(str, shape))},?\)\.$"):
        HypersphericalPullLoss()(np.array([0, 1, 2]), np.zeros(shape, np.float32))


@pytest.mark.parametrize("kwargs,name", [({"num_classes": 1}, "num_classes"), ({"dim": 0}, "dim"),
                                         ({"momentum": 1.0}, "momentum"), ({"prototypes": np.ones((K, DIM + 1))},
                                                                           "prototypes"),
                                         ({"prototypes": np.zeros((K, DIM))}, "prototypes")])
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


@pytest.mark.parametrize("freeze", ["layer", "model"])
def test_a_frozen_layer_keeps_its_representatives_in_fit(freeze):
    # As a frozen BatchNormalization keeps its moving statistics; with only the layer frozen the backbone trains.
    x, y = _data()
    model = build_training_model()
    layer = model.get_layer("protos")
    reps = np.random.default_rng(5).standard_normal((K, DIM)).astype(np.float32)
    layer.representatives.assign(reps / np.linalg.norm(reps, axis=1, keepdims=True))
    before = np.asarray(layer.representatives).copy()
    if freeze == "layer":
        layer.trainable = False
    else:
        model.trainable = False  # freezes every layer
    embed_before = np.asarray(model.get_layer("embed").kernel).copy()
    model.compile(optimizer="adam", loss=HypersphericalPullLoss())
    model.fit([x, y], y, epochs=1, batch_size=8, verbose=0, callbacks=[PrototypeReassignment()])
    np.testing.assert_array_equal(layer.representatives, before)
    assert np.any(np.asarray(model.get_layer("embed").kernel) != embed_before) == (freeze == "layer")
    model.trainable = layer.trainable = True
    model.compile(optimizer="adam", loss=HypersphericalPullLoss())
    model.fit([x, y], y, epochs=1, batch_size=8, verbose=0)
    assert np.any(np.asarray(layer.representatives) != before)


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
    sm = tf.saved_model.load(os.path.join(str(tmp_path), "saved_model", "1"))
    exported = np.asarray(sm.signatures["serving_default"](tf.constant(x))["output_0"])
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


def test_a_first_fit_may_start_at_a_later_epoch():
    """``initial_epoch > 0`` on a model that has seen no labels is not a resume: nothing to redo at its start, and
    the epoch's own re-assignment runs at its end."""
    x, y = _data(64)
    model = build_training_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=HypersphericalPullLoss())
    reassign = PrototypeReassignment()
    model.fit([x, y], y, epochs=3, initial_epoch=1, batch_size=16, verbose=0, callbacks=[reassign])
    assert len(reassign.changes) == 2 and np.any(np.asarray(model.get_layer("protos").representatives))


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


def test_batch_frequency_counts_the_batches_of_every_execution():
    """Under ``steps_per_execution=2`` Keras reports only batches 1, 3, 5, 7 of 8: ``(batch + 1) % 3 == 0`` met only
    batch 5, so one of the two in-epoch re-assignments (due after batches 3 and 6) was skipped."""
    x, y = _data(64)
    counts = {}
    for steps in (1, 2, 4):
        model = build_training_model()
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=HypersphericalPullLoss(), steps_per_execution=steps)
        calls = []
        reassign = PrototypeReassignment(frequency=5, batch_frequency=3)
        original = reassign.reassign
        reassign.reassign = lambda layer, calls=calls, original=original: calls.append(1) or original(layer)
        model.fit([x, y], y, epochs=2, batch_size=8, verbose=0, callbacks=[reassign])
        counts[steps] = len(calls)
    # 8 batches an epoch: after batches 3 and 6 (or the first execution past them), in each of the 2 epochs
    assert counts == {1: 4, 2: 4, 4: 4}


# --- prototypes computed once, never on load -----------------------------------------------------------------------
def _forbid_estimation(monkeypatch):
    import ot_layers.solvers.prototypes as solver

    def refuse(*args, **kwargs):
        raise AssertionError("estimate_prototypes was called")

    monkeypatch.setattr(solver, "estimate_prototypes", refuse)


def test_load_model_with_read_only_keras_home_does_not_estimate(tmp_path, monkeypatch):
    x, y = _data()
    model = build_training_model()
    model.get_layer("protos").assignment.assign(np.array([3, 1, 4, 0, 2], np.int32))
    path = str(tmp_path / "model.keras")
    model.save(path)
    home = tmp_path / "keras_home"
    home.mkdir()
    os.chmod(home, 0o500)  # read-only
    monkeypatch.setenv("KERAS_HOME", str(home))
    _forbid_estimation(monkeypatch)
    try:
        restored = keras.saving.load_model(path)
        out = restored([x, y], training=False)
    finally:
        os.chmod(home, 0o700)
    assert list(home.iterdir()) == []
    for name in ("prototypes", "assignment"):
        np.testing.assert_array_equal(getattr(restored.get_layer("protos"), name), getattr(model.get_layer("protos"),
                                                                                            name))
    np.testing.assert_allclose(out, model([x, y], training=False), atol=0)


def test_fresh_layer_estimates_once_and_given_prototypes_round_trip(tmp_path, monkeypatch):
    import ot_layers.solvers.prototypes as solver

    calls = []
    real = solver.estimate_prototypes
    monkeypatch.setattr(solver, "estimate_prototypes", lambda *a, **k: calls.append(a) or real(*a, **k))
    layer = HypersphericalPrototypes(K, DIM, seed=4)
    layer(np.zeros((2, DIM), np.float32))
    layer(np.ones((2, DIM), np.float32))
    assert calls == [(K, DIM)]
    np.testing.assert_array_equal(layer.prototypes, real(K, DIM, seed=4))
    # given prototypes: normalized, no estimation, and kept by the config (clone_model rebuilds them)
    given = np.random.default_rng(0).standard_normal((K, DIM))
    x = keras.Input((DIM,))
    model = keras.Model(x, HypersphericalPrototypes(K, DIM, prototypes=given, name="protos")(x))
    np.testing.assert_allclose(model.get_layer("protos").prototypes,
                               given / np.linalg.norm(given, axis=1, keepdims=True), atol=1e-7)
    clone = keras.models.clone_model(model)
    np.testing.assert_array_equal(clone.get_layer("protos").prototypes, model.get_layer("protos").prototypes)
    assert len(calls) == 1


def test_clone_model_estimates_on_first_real_call_only():
    x = keras.Input((DIM,))
    model = keras.Model(x, HypersphericalPrototypes(K, DIM, seed=2, name="protos")(x))
    clone = keras.models.clone_model(model)  # from_config: zero placeholder, weights not copied
    assert not np.any(np.asarray(clone.get_layer("protos").prototypes))
    z = np.random.default_rng(0).standard_normal((3, DIM)).astype(np.float32)
    np.testing.assert_allclose(clone(z), model(z), atol=1e-6)
    np.testing.assert_array_equal(clone.get_layer("protos").prototypes, model.get_layer("protos").prototypes)
    other = keras.models.clone_model(model)
    other.set_weights([np.eye(K, DIM, dtype=np.float32), np.arange(K, dtype=np.int32), np.zeros((K, DIM))])
    other(z)  # weights set by hand are kept
    np.testing.assert_array_equal(other.get_layer("protos").prototypes, np.eye(K, DIM))


def test_a_layer_from_its_config_estimates_on_its_first_eager_call():
    """A ``from_config`` layer first called eagerly, before anything built it, gave all-zero logits on that call
    (the estimate-if-zero check ran only for a built layer) and the estimated ones from the second call on."""
    z = np.random.default_rng(0).standard_normal((3, DIM)).astype(np.float32)
    layer = HypersphericalPrototypes(K, DIM, seed=2)
    expected = np.asarray(layer(z))
    clone = HypersphericalPrototypes.from_config(layer.get_config())
    first = np.asarray(clone(z))
    assert np.any(first)
    np.testing.assert_allclose(first, expected, atol=1e-6)
    np.testing.assert_allclose(np.asarray(clone(z)), expected, atol=1e-6)
    np.testing.assert_array_equal(clone.prototypes, layer.prototypes)


def test_a_large_fresh_layer_builds_the_simplex_optimum():
    """1000 prototypes in 1000 dimensions: the regular simplex's cosine -1/999 (its build time is a benchmark's:
    benchmarks/prototype_estimation.py)."""
    layer = HypersphericalPrototypes(1000, 1000)
    layer.build((None, 1000))
    assert abs(max_pairwise_cosine(layer.prototypes) + 1 / 999) < 1e-4


# --- numerical contract --------------------------------------------------------------------------------------------
def test_zero_feature_is_finite_and_nan_stays_in_its_sample():
    layer = HypersphericalPrototypes(K, DIM, momentum=0.5)
    z = np.random.default_rng(0).standard_normal((4, DIM)).astype(np.float32)
    z[1] = 0.0
    labels = np.array([0, 1, 2, 0], np.int32)
    tz = tf.Variable(z)
    with tf.GradientTape() as tape:
        logits = layer(tz)
        loss = tf.reduce_sum(HypersphericalPullLoss(reduction=None)(labels, logits))
    np.testing.assert_array_equal(logits[1], np.zeros(K))
    assert np.all(np.isfinite(tape.gradient(loss, tz)))
    # NaN in sample 2: the others' logits, their gradients and the representatives equal a run without it
    keep, out_bad, out_keep, g_bad, g_keep = run_with_a_bad_sample(layer, HypersphericalPullLoss(reduction=None), z,
                                                                   labels, 2, np.nan)
    assert np.all(np.isnan(out_bad[2]))
    np.testing.assert_allclose(out_bad[keep], out_keep, atol=1e-7)
    np.testing.assert_allclose(g_bad[keep], g_keep, atol=1e-6)
    bad = z.copy()
    bad[2, 0] = np.nan
    layer.representatives.assign(np.zeros((K, DIM)))
    layer(bad, labels=labels, training=True)
    with_bad = np.asarray(layer.representatives)
    layer.representatives.assign(np.zeros((K, DIM)))
    layer(z[keep], labels=labels[keep], training=True)
    np.testing.assert_allclose(with_bad, layer.representatives, atol=1e-7)
    assert np.all(np.isfinite(with_bad))


def test_mixed_precision_computes_in_float32():
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        layer = HypersphericalPrototypes(K, DIM)
        z = np.random.default_rng(0).standard_normal((3, DIM)).astype(np.float32)
        out = layer(z)
        assert layer.prototypes.dtype == "float32" and out.dtype == "float16"
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    expected = zn.astype(np.float16).astype(np.float64) @ np.asarray(layer.prototypes, np.float64).T
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, atol=2e-3)


def test_export_blocker_is_a_read_only_property():
    layer = HypersphericalPrototypes(K, DIM)
    assert isinstance(inspect.getattr_static(layer, "export_blocker"), property) and layer.export_blocker is None
    with pytest.raises(AttributeError):
        layer.export_blocker = "x"


# --- resume with BackupAndRestore ----------------------------------------------------------------------------------
def _resume_run(initial, x, y, callbacks, epochs=4, **fit):
    model = build_training_model()
    model.compile(optimizer=keras.optimizers.Adam(2e-2), loss=HypersphericalPullLoss())
    model.set_weights(initial)
    model.fit([x, y], y, epochs=epochs, batch_size=16, verbose=0, shuffle=False, callbacks=callbacks, **fit)
    return model


@pytest.mark.parametrize("backup_first", [False, True])
def test_prototype_reassignment_resume_equals_uninterrupted(tmp_path, backup_first):
    x, y = _data(64)
    initial = build_training_model().get_weights()
    initial[-2] = np.array([1, 2, 3, 4, 0], np.int32)  # assignment: start from a bad map

    reassigners = []

    def callbacks(backup=None, interrupt=None):
        reassign = PrototypeReassignment()
        reassigners.append(reassign)
        order = [reassign] if backup is None else ([backup, reassign] if backup_first else [reassign, backup])
        return order + ([] if interrupt is None else [interrupt])

    straight = _resume_run(initial, x, y, callbacks())
    backup_dir = str(tmp_path / f"backup_{backup_first}")
    with pytest.raises(RuntimeError, match="interrupted"):
        _resume_run(initial, x, y, callbacks(keras.callbacks.BackupAndRestore(backup_dir), Interrupt(0)))
    resumed = _resume_run(initial, x, y, callbacks(keras.callbacks.BackupAndRestore(backup_dir)))
    layer, other = straight.get_layer("protos"), resumed.get_layer("protos")
    assert reassigners[0].changes[0] > 0  # the interrupted epoch's re-assignment changed the map
    np.testing.assert_array_equal(other.assignment, layer.assignment)
    np.testing.assert_allclose(other.representatives, layer.representatives, atol=1e-6)
    for a, b in zip(resumed.get_weights(), straight.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for a, b in zip(resumed.optimizer.variables, straight.optimizer.variables):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", True])
def test_a_bad_seed_names_the_argument(seed):
    """NumPy's own error ("expected non-negative integer") named no argument."""
    from ot_layers.callbacks import GSPPrototypeInit
    from ot_layers.solvers import greedy_k_center

    for build in (lambda: greedy_k_center(np.eye(4), 2, seed=seed), lambda: estimate_prototypes(3, 4, seed=seed),
                  lambda: HypersphericalPrototypes(3, 2, seed=seed),
                  lambda: GSPPrototypeInit(np.zeros((2, 4, 4, 1)), seed=seed)):
        with pytest.raises(ValueError, match="`seed` must be an integer >= 0"):
            build()
