"""EDMS: random-walk manifold similarity, manifold proxy head and loss, hard proxies, partitions, ensemble."""
import inspect
import os

import keras
import numpy as np
import pytest
import scipy.linalg
import scipy.optimize
import tensorflow as tf

from ot_layers import ManifoldProxies
from ot_layers.callbacks import HardProxyUpdate
from ot_layers.callbacks.hard_proxies import hard_proxy_objective, harden_proxy
from ot_layers.losses import ManifoldProxyLoss
from ot_layers.solvers import random_walk_similarity
from tests import keras_checks
from tests.gradient_checks import run_with_a_bad_sample
from tests.resume_checks import Interrupt
from zoo import ensemble_embedding_model, meta_class_partitions

K, DIM, IN = 3, 4, 6


def _unit(rows, d, seed=0):
    x = np.random.default_rng(seed).standard_normal((rows, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_random_walk_is_the_fixed_point_of_the_iteration():
    x = _unit(7, 3)
    f = random_walk_similarity(x.astype(np.float32), alpha=0.8, temperature=0.5).numpy()
    s = np.exp(x @ x.T / 0.5)
    np.fill_diagonal(s, 0.0)
    d = s.sum(1)
    s_bar = s / np.sqrt(d[:, None] * d[None, :])
    it = np.eye(7)
    for _ in range(300):
        it = 0.8 * s_bar @ it + 0.2 * np.eye(7)
    np.testing.assert_allclose(f, it, atol=1e-5)
    np.testing.assert_allclose(f, f.T, atol=1e-6)


def test_random_walk_prefers_the_manifold_path():
    # a chain a - b - c - d on a circle arc, and e off to the side: d is nearer to a along the chain than e.
    angles = np.array([0.0, 0.5, 1.0, 1.5])
    chain = np.stack([np.cos(angles), np.sin(angles), np.zeros(4)], 1)
    outlier = np.array([[np.cos(1.1), 0.0, np.sin(1.1)]])  # cos(a, e) = cos(1.1) > cos(a, d) = cos(1.5)
    x = np.concatenate([chain, outlier]).astype(np.float32)
    f = random_walk_similarity(x, alpha=0.95, temperature=0.1).numpy()
    assert x[0] @ x[4] > x[0] @ x[3]
    assert f[0, 3] > f[0, 4]


@pytest.mark.parametrize("kwargs,name", [({"alpha": 1.0}, "alpha"), ({"alpha": 0.0}, "alpha"),
                                         ({"temperature": 0.0}, "temperature")])
def test_random_walk_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        random_walk_similarity(np.ones((3, 2), np.float32), **kwargs)


def _paper_formula(x, alpha=0.8, temperature=0.5):
    """Eq. 9 of Aziere and Todorovic 2019 in NumPy/SciPy, float64: unit rows (cosine 0 for an all-zero row), S =
    exp(cos / t) with a zero diagonal, S_bar = D^-1/2 S D^-1/2, F = (1 - alpha) (I - alpha S_bar)^-1 by
    scipy.linalg.inv."""
    x = np.asarray(x, np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    s = np.exp(x @ x.T / temperature)
    np.fill_diagonal(s, 0.0)
    d = s.sum(axis=1)
    s_bar = s / np.sqrt(np.outer(d, d))
    return (1.0 - alpha) * scipy.linalg.inv(np.eye(len(x)) - alpha * s_bar)


@pytest.mark.parametrize("alpha,temperature", [(0.8, 0.5), (0.95, 0.1), (0.3, 2.0)])
def test_random_walk_matches_the_papers_formula(alpha, temperature):
    x = np.random.default_rng(3).standard_normal((9, 4))
    x[4] *= 50.0  # un-normalized rows: the paper's embeddings are unit vectors, the solver normalizes
    f = random_walk_similarity(x.astype(np.float32), alpha=alpha, temperature=temperature).numpy()
    np.testing.assert_allclose(f, _paper_formula(x, alpha, temperature), atol=2e-6, rtol=1e-5)
    big = random_walk_similarity((1e4 * x).astype(np.float32), alpha=alpha, temperature=temperature).numpy()
    np.testing.assert_allclose(big, f, atol=1e-6)  # exp(1e8 x.x') would overflow without the normalization
    huge = random_walk_similarity((1e20 * x).astype(np.float32), alpha=alpha, temperature=temperature).numpy()
    np.testing.assert_allclose(huge, f, atol=1e-6)  # ||x||^2 overflows float32: rows went to zero, F uniform


def test_random_walk_batched_zero_rows_and_tiny_temperature_are_finite():
    x = np.random.default_rng(4).standard_normal((2, 6, 3))
    x[1, 2] = 0.0
    f = random_walk_similarity(x.astype(np.float32)).numpy()
    for b in range(2):
        np.testing.assert_allclose(f[b], _paper_formula(x[b]), atol=2e-6, rtol=1e-5)
    xv = tf.Variable(x.astype(np.float32))
    for temperature in (0.5, 1e-3):  # at 1e-3 exp(cos / t) underflows for all but the closest pairs
        with tf.GradientTape() as tape:
            out = random_walk_similarity(xv, temperature=temperature)
            loss = tf.reduce_sum(out * out)
        assert np.all(np.isfinite(out)) and np.all(np.isfinite(tape.gradient(loss, xv)))


def test_random_walk_cuts_out_a_nan_point():
    x = np.random.default_rng(5).standard_normal((7, 3)).astype(np.float32)
    bad = x.copy()
    bad[2, 1] = np.nan
    keep = [0, 1, 3, 4, 5, 6]
    tb, tk = tf.Variable(bad), tf.Variable(x[keep])
    weights = np.random.default_rng(6).standard_normal((6, 6)).astype(np.float32)
    with tf.GradientTape(persistent=True) as tape:
        f_bad = random_walk_similarity(tb)
        f_keep = random_walk_similarity(tk)
        loss_bad = tf.reduce_sum(tf.gather(tf.gather(f_bad, keep), keep, axis=1) * weights)
        loss_keep = tf.reduce_sum(f_keep * weights)
    f_bad = f_bad.numpy()
    assert np.all(np.isnan(f_bad[2])) and np.all(np.isnan(f_bad[:, 2]))
    np.testing.assert_allclose(f_bad[np.ix_(keep, keep)], _paper_formula(x[keep]), atol=2e-6, rtol=1e-5)
    g_bad = tape.gradient(loss_bad, tb).numpy()
    np.testing.assert_allclose(g_bad[keep], tape.gradient(loss_keep, tk), atol=1e-5)
    assert np.all(g_bad[2] == 0.0)


def _head(mode):
    layer = ManifoldProxies(K, DIM, mode=mode)
    layer.build((None, DIM))
    layer.proxies.assign(_unit(K, DIM, 5).astype(np.float32))
    return layer


def test_head_modes_match_numpy():
    x = _unit(5, DIM, 1).astype(np.float32)
    p = _unit(K, DIM, 5)
    f = random_walk_similarity(np.concatenate([x, p]).astype(np.float32)).numpy()
    np.testing.assert_allclose(_head("direct")(x), x @ p.T, atol=1e-6)
    np.testing.assert_allclose(_head("intrinsic")(x), f[:5, 5:], atol=1e-6)
    np.testing.assert_allclose(_head("contextual")(x), f[:5, 5:] @ f[5:, 5:].T, atol=1e-6)


def test_manifold_loss_matches_formula():
    s = np.array([[0.3, 0.1, -0.2], [0.0, 0.5, 0.4]], np.float32)
    y = np.array([0, 2])
    m = 0.05
    expected = [np.log(1 + np.exp(0.1 - 0.3 + m) + np.exp(-0.2 - 0.3 + m)),
                np.log(1 + np.exp(0.0 - 0.4 + m) + np.exp(0.5 - 0.4 + m))]
    np.testing.assert_allclose(ManifoldProxyLoss(margin=m)(y, s), np.mean(expected), rtol=1e-6)
    with pytest.raises(ValueError, match="margin"):
        ManifoldProxyLoss(margin=-1.0)


def test_manifold_loss_of_a_label_outside_the_classes_is_zero():
    """-1 (an unlabelled sample) or K contributes zero, the policy of every loss on class labels here."""
    s = np.array([[0.3, 0.1, -0.2], [0.0, 0.5, 0.4], [0.2, 0.2, 0.1]], np.float32)
    per_sample = ManifoldProxyLoss(reduction=None)(np.array([0, -1, K]), s)
    np.testing.assert_allclose(per_sample[1:], [0.0, 0.0])
    assert float(per_sample[0]) > 0


@pytest.mark.parametrize("shape", [(3, 4, 2), (3,)])
def test_manifold_loss_names_y_pred_of_the_wrong_rank(shape):
    """Rank 3 failed in a TensorFlow SelectV2 broadcast, rank 1 with an IndexError."""
    with pytest.raises(ValueError, match=r"^`y_pred` of ManifoldProxyLoss must be the \(B, num_classes\) proxy "
                                         rf"similarities .*got shape \({', '.join(map(str, shape))},?\)\.$"):
        ManifoldProxyLoss()(np.array([0, 1, 2]), np.zeros(shape, np.float32))


def test_hard_proxy_gradient_and_descent():
    anchor, members = _unit(1, DIM, 2)[0], _unit(20, DIM, 3)
    p = _unit(1, DIM, 4)[0]
    value, grad = hard_proxy_objective(p, anchor, members)
    eps = 1e-6
    numeric = [(hard_proxy_objective(p + eps * e, anchor, members)[0]
                - hard_proxy_objective(p - eps * e, anchor, members)[0]) / (2 * eps) for e in np.eye(DIM)]
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)
    hard = harden_proxy(anchor, members, max_iter=200, learning_rate=0.1)
    assert hard_proxy_objective(hard, anchor, members)[0] < hard_proxy_objective(anchor, anchor, members)[0]
    # pushed away from its own meta-class: lower mean similarity to the members than the anchor had
    assert np.mean(members @ hard) < np.mean(members @ anchor)


def test_harden_proxy_run_to_its_threshold_reaches_the_minimum_on_the_sphere():
    """With a small threshold the descent at the paper's learning rate (1e-3) reaches eq. 7's minimum on the unit
    sphere, as SciPy's BFGS finds it (over ``q``, with ``p = q / |q|``); 100 steps, the default, stay near the
    anchor (each step moves the proxy by at most 1e-3 times the gradient's norm)."""
    rng = np.random.default_rng(5)
    center = _unit(1, 16, 6)[0]
    members = center + 0.4 * rng.standard_normal((64, 16))
    members /= np.linalg.norm(members, axis=1, keepdims=True)
    anchor = members[0]

    def on_sphere(q):
        return hard_proxy_objective(q / np.linalg.norm(q), anchor, members[1:])[0]

    reference = scipy.optimize.minimize(on_sphere, anchor, method="BFGS", options={"gtol": 1e-10}).x
    reference /= np.linalg.norm(reference)
    converged = harden_proxy(anchor, members[1:], max_iter=200_000, learning_rate=1e-3, threshold=1e-9)
    np.testing.assert_allclose(converged, reference, atol=1e-4)
    assert np.linalg.norm(reference - anchor) > 0.3  # the minimum lies far from the anchor
    assert np.linalg.norm(harden_proxy(anchor, members[1:]) - anchor) < 0.1  # 100 steps of 1e-3 do not reach it


def test_meta_class_partitions():
    parts = meta_class_partitions(10, 3, num_learners=4, seed=1)
    assert parts.shape == (4, 10)
    for row in parts:
        assert sorted(np.bincount(row, minlength=3).tolist()) == [3, 3, 4]
    assert len({tuple(r) for r in parts}) > 1
    with pytest.raises(ValueError, match="num_meta_classes"):
        meta_class_partitions(3, 4)


def _data(n=48, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, K, n).astype(np.int32)
    x = (rng.standard_normal((n, IN)) + 2.0 * np.eye(K, IN)[y]).astype(np.float32)
    return x, y


def _build(mode="contextual"):
    def build():
        x = keras.Input((IN,), name="x")
        e = keras.layers.Dense(DIM, name="embed")(x)
        return keras.Model(x, ManifoldProxies(K, DIM, mode=mode, name="head")(e))
    return build


def _embedding(model):
    return keras.Model(model.inputs, model.get_layer("embed").output)


@pytest.mark.parametrize("mode", ["contextual", "intrinsic", "direct"])
def test_fit_with_hard_proxy_callback(mode):
    x, y = _data()
    model = _build(mode)()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=ManifoldProxyLoss())
    callback = HardProxyUpdate(_embedding(model), x, y, max_iter=20, learning_rate=0.1, samples_per_meta_class=8)
    # each meta-class's anchor and members are training images of that meta-class, the anchor not among them
    for k, (anchor, members) in enumerate(zip(callback.anchors, callback.members)):
        assert y[anchor] == k and np.all(y[members] == k) and anchor not in members and 1 <= len(members) <= 8

    def expected_proxies():
        """Eq. 7's hard proxies from the embeddings of this moment, computed here: normalized anchor and member
        embeddings, then ``harden_proxy`` (its gradient checked above against finite differences, its descent by
        the objective) per meta-class."""
        embed = _embedding(model)
        z = [embed.predict(x[[anchor, *members]], verbose=0).astype(np.float64)
             for anchor, members in zip(callback.anchors, callback.members)]
        z = [rows / np.linalg.norm(rows, axis=1, keepdims=True) for rows in z]
        return np.stack([harden_proxy(rows[0], rows[1:], max_iter=20, learning_rate=0.1) for rows in z])

    seen = []  # at each epoch start, right after the update: the layer's proxies and the proxies of that moment
    record = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: seen.append(
        (np.asarray(model.get_layer("head").proxies), expected_proxies())))
    history = model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[callback, record])
    assert np.all(np.isfinite(history.history["loss"]))
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert len(seen) == 3 and not np.allclose(seen[0][0], seen[-1][0])  # re-estimated every epoch
    for proxies, expected in seen:
        np.testing.assert_allclose(np.linalg.norm(proxies, axis=1), 1.0, atol=1e-5)
        np.testing.assert_allclose(proxies, expected, atol=1e-5)
    soft = HardProxyUpdate(_embedding(model), x, y, harden=False, samples_per_meta_class=8)
    anchors = _embedding(model).predict(x[soft.anchors], verbose=0)
    np.testing.assert_allclose(soft.compute_proxies(), anchors / np.linalg.norm(anchors, axis=1, keepdims=True),
                               atol=1e-5)


def test_callback_rejects_bad_input():
    x, y = _data()
    with pytest.raises(ValueError, match="meta_labels"):
        HardProxyUpdate(None, x, y[:-1])
    with pytest.raises(ValueError, match="meta_labels"):
        HardProxyUpdate(None, x[:4], np.array([0, 0, 0, 1]))
    with pytest.raises(ValueError, match="mode"):
        ManifoldProxies(K, DIM, mode="nope")


def test_save_load_roundtrip(tmp_path):
    x, _ = _data()
    model = _build()()
    model.get_layer("head").proxies.assign(_unit(K, DIM, 7).astype(np.float32))
    restored = keras_checks.assert_save_load_roundtrip(model, x, tmp_path, atol=1e-6)
    np.testing.assert_array_equal(restored.get_layer("head").proxies, model.get_layer("head").proxies)


def test_fits_with_xla():
    x, y = _data()
    keras_checks.assert_fits_with_xla(_build(), x, y, ManifoldProxyLoss())


def test_fits_mirrored():
    x, y = _data()
    keras_checks.assert_fits_mirrored(_build("intrinsic"), x, y, ManifoldProxyLoss())


def test_mixed_precision():
    x, _ = _data()
    keras_checks.assert_mixed_precision(_build(), x, float32_model=_build()())


def test_head_refuses_export_and_ensemble_exports(tmp_path):
    import export

    x, _ = _data()
    model = _build()()
    model(x)
    with pytest.raises(ValueError, match="training head"):
        export.to_saved_model(model, str(tmp_path / "refused"))
    learners = [_embedding(_build()()) for _ in range(3)]
    ensemble = ensemble_embedding_model(learners)
    out = np.asarray(ensemble(x))
    assert out.shape == (len(x), 3 * DIM)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(out[:, DIM:2 * DIM] * np.sqrt(3),
                               keras.layers.UnitNormalization()(learners[1](x)), atol=1e-5)
    keras_checks.assert_export_parity(ensemble, x, tmp_path)


def test_ensemble_names_learners_that_cannot_be_joined():
    """A learner with a feature map gave (batch, h, w, d) outputs of norm sqrt(h w), not unit vectors; learners of
    other inputs failed at predict; one model not in a list, or a string, failed with Python's errors."""
    learner = _embedding(_build()())
    feature_map = keras.Sequential([keras.Input((6, 6, 3)), keras.layers.Conv2D(8, 1)])
    other_input = keras.Sequential([keras.Input((5,)), keras.layers.Dense(DIM)])
    for learners, match in [(learner, "^`learners` must be a non-empty list"),
                            ([learner, "b"], r"^`learners`\[1\] must be a built"),
                            ([feature_map], r"^`learners`\[0\] must output embeddings \(batch, d\)"),
                            ([learner, other_input], "^`learners` must take the same input"),
                            ([learner, learner], r"^`learners`\[1\] is an earlier learner again")]:
        with pytest.raises(ValueError, match=match):
            ensemble_embedding_model(learners)


def test_ensemble_of_learners_the_zoo_named_alike(tmp_path):
    """``zoo.embedding_model`` names every model of one kind alike; Keras refused the ensemble ("The name ... is used
    3 times in the model")."""
    import zoo

    learners = [zoo.embedding_model("small_convnet", "gap", 8, input_shape=(16, 16, 1)) for _ in range(3)]
    assert len({learner.name for learner in learners}) == 1
    ensemble = ensemble_embedding_model(learners)
    x = np.random.default_rng(0).uniform(0, 255, (4, 16, 16, 1)).astype(np.float32)
    out = np.asarray(ensemble(x))
    for i, learner in enumerate(learners):  # each part is its own learner's normalized embedding
        np.testing.assert_allclose(out[:, 8 * i:8 * (i + 1)] * np.sqrt(3),
                                   keras.layers.UnitNormalization()(learner(x)), atol=1e-5)
    ensemble.save(tmp_path / "ensemble.keras")
    np.testing.assert_allclose(np.asarray(keras.models.load_model(tmp_path / "ensemble.keras")(x)), out, atol=1e-6)
    learners[2] = zoo.embedding_model("small_convnet", "gap", 8, input_shape=(16, 16, 1),
                                      name="small_convnet_gap_embedding_1")  # the name the second would get
    parts = [layer.name for layer in ensemble_embedding_model(learners).layers[1:4]]
    assert len(set(parts)) == 3 and "small_convnet_gap_embedding_1" in parts


# --- vocabulary and numerical contract of the head -----------------------------------------------------------------
def test_head_vocabulary():
    layer = ManifoldProxies(num_classes=K, dim=DIM, temperature=0.25)
    config = layer.get_config()
    assert config["num_classes"] == K and "num_proxies" not in config and config["temperature"] == 0.25
    with pytest.raises(TypeError):
        ManifoldProxies(num_proxies=K, dim=DIM)
    assert isinstance(inspect.getattr_static(layer, "export_blocker"), property)
    assert "embedding model" in layer.export_blocker
    with pytest.raises(AttributeError):
        layer.export_blocker = None
    # temperature divides the cosines inside exp
    x = _unit(5, DIM, 1).astype(np.float32)
    layer.build((None, DIM))
    p = _unit(K, DIM, 5)
    layer.proxies.assign(p.astype(np.float32))
    f = _paper_formula(np.concatenate([x, p]), temperature=0.25)
    layer.mode = "intrinsic"
    np.testing.assert_allclose(layer(x), f[:5, 5:], atol=2e-6)


@pytest.mark.parametrize("mode", ["contextual", "intrinsic", "direct"])
def test_head_zero_embedding_finite_and_nan_confined(mode):
    head = _head(mode)
    x = _unit(5, DIM, 1).astype(np.float32)
    x[3] = 0.0
    tx = tf.Variable(x)
    with tf.GradientTape() as tape:
        out = head(tx)
        loss = tf.reduce_sum(out * out)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(tape.gradient(loss, tx)))
    labels = np.array([0, 2, 1, 1, 0], np.int32)
    keep, out_bad, out_keep, g_bad, g_keep = run_with_a_bad_sample(head, ManifoldProxyLoss(reduction=None), x,
                                                                   labels, 1, np.inf)
    assert np.all(np.isnan(out_bad[1]))
    np.testing.assert_allclose(out_bad[keep], out_keep, atol=1e-6)
    # (the zero row's gradient is large: d(x/max(|x|, 1e-6))/dx at 0 is I/1e-6; compared relatively)
    np.testing.assert_allclose(g_bad[keep], g_keep, atol=1e-5, rtol=1e-4)
    assert np.all(g_bad[1] == 0.0)


def test_head_computes_in_float32_under_mixed_precision():
    x = _unit(5, DIM, 1).astype(np.float32)
    reference = _head("contextual")(x).numpy()
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        head = _head("contextual")
        out = head(x)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert head.proxies.dtype == "float32" and out.dtype == "float16"
    # the contextual similarities are ~1e-2: float16 arithmetic inside would lose them; float32 keeps fp16 rounding
    np.testing.assert_allclose(np.asarray(out, np.float32), reference, rtol=1e-3, atol=1e-6)


def test_harden_proxy_threshold_stops_early():
    anchor, members = _unit(1, DIM, 2)[0], _unit(20, DIM, 3)
    np.testing.assert_array_equal(harden_proxy(anchor, members, max_iter=50, learning_rate=0.1, threshold=10.0),
                                  harden_proxy(anchor, members, max_iter=1, learning_rate=0.1))
    with pytest.raises(ValueError, match="threshold"):
        HardProxyUpdate(None, *_data(), threshold=-1.0)


def test_hard_proxy_callback_rejects_nan_embeddings_and_wrong_layer():
    x, y = _data()
    model = _build()()
    model.compile(optimizer="adam", loss=ManifoldProxyLoss())
    nan_embedding = keras.Sequential([keras.Input((IN,)), keras.layers.Lambda(lambda t: t[:, :DIM] * np.nan)])
    with pytest.raises(ValueError, match="embedding_model"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[HardProxyUpdate(nan_embedding, x, y,
                                                                        samples_per_meta_class=4)])
    with pytest.raises(ValueError, match="meta_labels"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[HardProxyUpdate(_embedding(model), x, y % 2,
                                                                        samples_per_meta_class=4)])
    with pytest.raises(ValueError, match="layer_name"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[HardProxyUpdate(_embedding(model), x, y, layer_name="no")])


# --- resume with BackupAndRestore ----------------------------------------------------------------------------------
@pytest.mark.parametrize("backup_first", [False, True])
def test_hard_proxy_update_resume_equals_uninterrupted(tmp_path, backup_first):
    x, y = _data()
    initial = _build()().get_weights()
    backup_dir = str(tmp_path / "backup")

    def run(backup=None, interrupt=None):
        model = _build()()
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=ManifoldProxyLoss())
        model.set_weights(initial)
        update = HardProxyUpdate(_embedding(model), x, y, max_iter=10, learning_rate=0.1, samples_per_meta_class=8)
        order = [update] if backup is None else ([backup, update] if backup_first else [update, backup])
        model.fit(x, y, epochs=3, batch_size=16, verbose=0, shuffle=False,
                  callbacks=order + ([] if interrupt is None else [interrupt]))
        return model

    straight = run()
    with pytest.raises(RuntimeError, match="interrupted"):
        run(keras.callbacks.BackupAndRestore(backup_dir), Interrupt(0))
    resumed = run(keras.callbacks.BackupAndRestore(backup_dir))
    assert not np.allclose(straight.get_layer("head").proxies, initial[-1])  # the callback decided something
    np.testing.assert_allclose(resumed.get_layer("head").proxies, straight.get_layer("head").proxies, atol=1e-6)
    for a, b in zip(resumed.get_weights() + resumed.optimizer.variables,
                    straight.get_weights() + straight.optimizer.variables):
        np.testing.assert_allclose(a, b, atol=1e-6)
    assert not os.path.exists(backup_dir)  # a finished run removes its backup
