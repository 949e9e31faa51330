"""CCP: greedy k-center proxy re-initialization on a validation plateau, proximal penalty towards theta*."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from ot_layers import ClassProxies
from ot_layers.callbacks import CCPReinitialization
from ot_layers.callbacks.ccp import k_center_proxies, remove_ccp_state
from ot_layers.losses import ProxyAnchorLoss
from training.evaluation.retrieval import retrieval_metrics

C, P, DIM, IN = 3, 2, 4, 6


def test_k_center_proxies_follow_algorithm_2():
    rng = np.random.default_rng(0)
    pool = rng.standard_normal((12, DIM))
    current = rng.standard_normal((P, DIM))
    chosen = k_center_proxies(pool, current)
    unit_pool = pool / np.linalg.norm(pool, axis=1, keepdims=True)
    centers = list(current / np.linalg.norm(current, axis=1, keepdims=True))
    for row in chosen:  # each pick is the pool point farthest from the current proxies and earlier picks
        dist = np.min(((unit_pool[:, None] - np.asarray(centers)[None]) ** 2).sum(-1), axis=1)
        np.testing.assert_allclose(row, unit_pool[np.argmax(dist)])
        centers.append(row)
    # random sampling when the pool holds exactly P points: all of them are taken
    np.testing.assert_allclose(sorted(map(tuple, k_center_proxies(pool[:P], current))),
                               sorted(map(tuple, unit_pool[:P])))


def test_k_center_rejects_non_finite_points():
    from ot_layers.solvers import greedy_k_center
    points = np.random.default_rng(1).standard_normal((6, DIM))
    points[2, 1] = np.nan
    with pytest.raises(ValueError, match="points"):
        greedy_k_center(points, 2)
    with pytest.raises(ValueError, match="initial"):
        greedy_k_center(np.ones((3, DIM)), 1, initial=np.full((1, DIM), np.inf))


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % C).astype(np.int32)
    x = (rng.standard_normal((n, IN)) + 3.0 * np.eye(C, IN)[y]).astype(np.float32)
    return x, y


def _model(optimizer=None):
    x = keras.Input((IN,))
    e = keras.layers.Dense(DIM, name="embed")(x)
    proxies = ClassProxies(C, num_proxies=P, name="proxies")
    model = keras.Model(x, proxies(e), name="model")
    model.compile(optimizer=optimizer or keras.optimizers.Adam(1e-2), loss=ProxyAnchorLoss())
    return model, proxies


def _weights(model):
    """The model's own weights (without the CCP state the callback attaches)."""
    state = {id(v) for v in model.ccp_state.weights} if hasattr(model, "ccp_state") else set()
    return [np.asarray(w) for w in model.weights if id(w) not in state]


def test_reinitializes_on_plateau_and_pulls_towards_anchor():
    x, y = _data()
    model, proxies = _model()
    scores = iter([0.5, 0.4, 0.3, 0.6, 0.2, 0.1, 0.1, 0.1])  # plateau after epoch 1 (patience 2): re-init at 3
    snapshots = []
    ccp = CCPReinitialization(x, y, validation_score=lambda: next(scores), patience=2, pool_size=5, proximal=0.5)
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: snapshots.append(
        (ccp.reinitializations, _weights(model))))
    history = model.fit(x, y, epochs=6, batch_size=20, verbose=0, shuffle=False, callbacks=[ccp, record])
    assert history.history["val_score"] == pytest.approx([0.5, 0.4, 0.3, 0.6, 0.2, 0.1])
    # epochs 2-3 do not improve on 0.5: after epoch 3 one re-initialization; epoch 4 improves; 5-6 plateau: another
    assert [s[0] for s in snapshots] == [0, 0, 1, 1, 1, 2]
    after_first = snapshots[2][1]
    # reset to the best weights (epoch 1) except the proxies, which are k-center picks of embedded training images
    best = snapshots[0][1]
    kernel_index = [i for i, w in enumerate(model.weights) if w.path.endswith("embed/kernel")][0]
    proxy_index = [i for i, w in enumerate(model.weights) if w is proxies.proxies][0]
    np.testing.assert_allclose(after_first[kernel_index], best[kernel_index])
    new_proxies = after_first[proxy_index]
    np.testing.assert_allclose(np.linalg.norm(new_proxies, axis=-1), 1.0, atol=1e-5)
    # the final model holds the best weights (epoch 4's)
    np.testing.assert_allclose(_weights(model)[kernel_index], snapshots[3][1][kernel_index])
    assert float(model.ccp_state.reinitializations.numpy()) == 2.0


def test_removing_the_state_gives_the_architectures_weights_back():
    """The state's variables ride in ``model.weights`` (for checkpoints); once removed, the trained weights go into a
    model of the same architecture by ``set_weights`` and predict the same, and a new CCP run starts at round 0."""
    x, y = _data()
    model, _ = _model()
    own = len(model.weights)
    scores = iter([0.5, 0.4, 0.3, 0.2])
    ccp = CCPReinitialization(x, y, validation_score=lambda: next(scores), patience=1, pool_size=5)
    model.fit(x, y, epochs=3, batch_size=20, verbose=0, callbacks=[ccp])
    assert len(model.weights) > own and ccp.reinitializations > 0
    trained = _weights(model)
    state = remove_ccp_state(model)
    assert state is not None and not hasattr(model, "ccp_state") and remove_ccp_state(model) is None
    assert len(model.weights) == own and all(np.array_equal(a, b) for a, b in zip(model.get_weights(), trained))
    twin, _ = _model()
    twin.set_weights(model.get_weights())
    np.testing.assert_array_equal(twin.predict(x, verbose=0), model.predict(x, verbose=0))
    again = CCPReinitialization(x, y, validation_score=lambda: 0.1, patience=5, pool_size=5)
    model.fit(x, y, epochs=1, batch_size=20, verbose=0, callbacks=[again])
    assert again.reinitializations == 0 and model.ccp_state is not state


def test_proximal_penalty_is_the_regularized_loss_gradient_through_the_optimizer():
    """One SGD step with the penalty active equals theta - lr (grad L + lambda (theta - theta*)), the proxies
    excluded (Algorithm 1's g_theta), with grad L computed separately."""
    x, y = _data()
    lr, lam = 0.05, 0.3
    model, proxies = _model(keras.optimizers.SGD(lr))
    ccp = CCPReinitialization(x, y, validation_score=lambda: 0.0, proximal=lam)
    ccp.set_model(model)
    ccp.on_train_begin()  # fit installs the penalty there
    state = model.ccp_state
    rng = np.random.default_rng(4)
    for anchor in state.anchors:
        anchor.assign(rng.normal(size=anchor.shape).astype(np.float32))
    state.proximal_active.assign(1.0)
    pulled = ccp._pulled_weights()
    assert all(w is not proxies.proxies for w in pulled) and len(pulled) == 2
    before = {w.path: np.asarray(w) for w in model.trainable_weights}
    with tf.GradientTape() as tape:
        loss = ProxyAnchorLoss()(y, model(x))
    grads = dict(zip([w.path for w in model.trainable_weights], tape.gradient(loss, model.trainable_weights)))
    penalty = sum(0.5 * lam * np.sum((np.asarray(w) - np.asarray(a)) ** 2) for w, a in zip(pulled, state.anchors))
    np.testing.assert_allclose(float(sum(model.losses)), penalty, rtol=1e-5)
    model.fit(x, y, epochs=1, batch_size=len(x), verbose=0, shuffle=False, callbacks=[ccp])
    anchors = {w.path: np.asarray(a) for w, a in zip(pulled, state.anchors)}
    for w in model.trainable_weights:
        expected = before[w.path] - lr * (np.asarray(grads[w.path]) + (
            lam * (before[w.path] - anchors[w.path]) if w.path in anchors else 0.0))
        np.testing.assert_allclose(np.asarray(w), expected, atol=1e-5, err_msg=w.path)
    assert not model.losses  # the penalty is removed at the end of training


def test_ccp_with_real_map_at_r_trains():
    x, y = _data(90)
    xv, yv = _data(45, seed=1)
    model, proxies = _model()
    embed = keras.Model(model.inputs, model.get_layer("embed").output)
    ccp = CCPReinitialization(x, y, patience=1, pool_size=6, embedding_model=embed,
                              validation_score=lambda: retrieval_metrics(embed.predict(xv, verbose=0), yv,
                                                                         nmi=False)["map_at_r"])
    history = model.fit(x, y, epochs=4, batch_size=30, verbose=0, callbacks=[ccp])
    assert np.all(np.isfinite(history.history["loss"]))
    assert max(ccp.history) > 0.4  # 3 well-separated classes: retrieval clearly above chance (1/3)
    assert retrieval_metrics(embed.predict(xv, verbose=0), yv, nmi=False)["map_at_r"] == pytest.approx(
        max(ccp.history), abs=1e-6)  # best weights restored


def test_rejects_bad_arguments():
    x, y = _data()
    model, proxies = _model()
    with pytest.raises(ValueError, match="pool_size"):
        CCPReinitialization(x, y, lambda: 0.0, pool_size=1).set_model(model)
    with pytest.raises(ValueError, match="train_labels"):
        CCPReinitialization(x, y + 1, lambda: 0.0).set_model(model)
    with pytest.raises(ValueError, match="layer_name"):
        CCPReinitialization(x, y, lambda: 0.0, layer_name="embed").set_model(model)
    with pytest.raises(ValueError, match="validation_score"):
        CCPReinitialization(x, y, 0.5)
    with pytest.raises(ValueError, match="proximal"):
        CCPReinitialization(x, y, lambda: 0.0, proximal=-1.0)


def test_min_delta_counts_small_gains_as_plateau():
    x, y = _data()
    model, proxies = _model()
    scores = iter([0.5, 0.501, 0.502, 0.6])
    ccp = CCPReinitialization(x, y, validation_score=lambda: next(scores), patience=2, pool_size=4, min_delta=0.01)
    model.fit(x, y, epochs=4, batch_size=20, verbose=0, callbacks=[ccp])
    assert ccp.reinitializations == 1  # epochs 2 and 3 gain less than min_delta


def test_min_delta_is_measured_from_a_reference_that_small_gains_do_not_move():
    """Steady gains of 0.008 against min_delta=0.01 (patience 3): each moved the reference before, so CCP saw a
    plateau after three epochs of progress; as in keras.callbacks.EarlyStopping the reference (and theta*) now stays
    until a gain above min_delta, and 0.516 is one (0.016 above 0.5)."""
    x, y = _data()
    model, proxies = _model()
    scores = [0.5, 0.508, 0.516, 0.524]
    feed = iter(scores)
    snapshots = []
    ccp = CCPReinitialization(x, y, validation_score=lambda: next(feed), patience=3, pool_size=4, min_delta=0.01)
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: snapshots.append(_weights(model)))
    model.fit(x, y, epochs=4, batch_size=20, verbose=0, shuffle=False, callbacks=[ccp, record])
    assert ccp.reinitializations == 0
    stopping = keras.callbacks.EarlyStopping(monitor="s", mode="max", patience=3, min_delta=0.01)
    stopping.set_model(keras.Sequential())
    stopping.on_train_begin()
    for epoch, score in enumerate(scores):
        stopping.on_epoch_end(epoch, {"s": score})
    state = model.ccp_state
    assert float(state.problem_score.numpy()) == pytest.approx(stopping.best)
    assert float(state.wait.numpy()) == stopping.wait == 1
    assert float(state.best_score.numpy()) == pytest.approx(0.524)  # the overall best follows every gain
    for kept, snapshot in zip(_weights_of(state.problem_best), snapshots[2]):  # theta*: the reference's weights
        np.testing.assert_array_equal(kept, snapshot)
    for kept, snapshot in zip(_weights_of(state.best), snapshots[3]):
        np.testing.assert_array_equal(kept, snapshot)


def _weights_of(variables):
    return [np.asarray(v) for v in variables]


def test_plateau_is_judged_per_problem():
    x, y = _data()
    model, proxies = _model()
    # problem 1 peaks at 0.9; problem 2 starts low but keeps improving on its own best: no second re-init
    scores = iter([0.9, 0.8, 0.7, 0.3, 0.4, 0.5, 0.6])
    ccp = CCPReinitialization(x, y, validation_score=lambda: next(scores), patience=2, pool_size=4)
    model.fit(x, y, epochs=7, batch_size=20, verbose=0, callbacks=[ccp])
    assert ccp.reinitializations == 1
