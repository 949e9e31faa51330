"""CCP: greedy k-center proxy re-initialization on a validation plateau, proximal pull towards theta*."""
import keras
import numpy as np
import pytest

from ot_layers import ClassProxies
from ot_layers.callbacks import CCPReinitialization
from ot_layers.callbacks.ccp import k_center_proxies
from ot_layers.losses import ProxyAnchorLoss
from training.evaluation import retrieval_metrics

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


def _data(n=60, seed=0):
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % C).astype(np.int32)
    x = (rng.standard_normal((n, IN)) + 3.0 * np.eye(C, IN)[y]).astype(np.float32)
    return x, y


def _model():
    x = keras.Input((IN,))
    e = keras.layers.Dense(DIM, name="embed")(x)
    proxies = ClassProxies(C, proxies_per_class=P, name="proxies")
    model = keras.Model(x, proxies(e))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=ProxyAnchorLoss(proxies))
    return model, proxies


def test_reinitializes_on_plateau_and_pulls_towards_anchor():
    x, y = _data()
    model, proxies = _model()
    scores = iter([0.5, 0.4, 0.3, 0.6, 0.2, 0.1, 0.1, 0.1])  # plateau after epoch 1 (patience 2): re-init at 3
    snapshots = []
    ccp = CCPReinitialization(model, proxies.proxies, x, y, validation_score=lambda: next(scores), patience=2,
                              pool_size=5, proximal=0.5)
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: snapshots.append(
        (ccp.reinitializations, [np.asarray(w) for w in model.get_weights()])))
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
    np.testing.assert_allclose(model.get_weights()[kernel_index], snapshots[3][1][kernel_index])


def test_proximal_step_is_the_ema_form():
    x, y = _data()
    model, proxies = _model()
    ccp = CCPReinitialization(model, proxies.proxies, x, y, validation_score=lambda: 0.0, proximal=0.25)
    ccp.set_model(model)
    anchor = [np.zeros_like(np.asarray(w)) for w in ccp._pulled_weights()]
    ccp._anchor = anchor
    before = [np.asarray(w) for w in ccp._pulled_weights()]
    proxies_before = np.asarray(proxies.proxies)
    ccp.on_train_batch_end(0)
    for w, b in zip(ccp._pulled_weights(), before):
        np.testing.assert_allclose(np.asarray(w), 0.75 * b, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(proxies.proxies), proxies_before)  # proxies are not pulled


def test_ccp_with_real_map_at_r_trains():
    x, y = _data(90)
    xv, yv = _data(45, seed=1)
    model, proxies = _model()
    embed = keras.Model(model.inputs, model.get_layer("embed").output)
    ccp = CCPReinitialization(embed, proxies.proxies, x, y, patience=1, pool_size=6,
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
        CCPReinitialization(model, proxies.proxies, x, y, lambda: 0.0, pool_size=1)
    with pytest.raises(ValueError, match="train_labels"):
        CCPReinitialization(model, proxies.proxies, x, y + 1, lambda: 0.0)
    with pytest.raises(ValueError, match="validation_score"):
        CCPReinitialization(model, proxies.proxies, x, y, 0.5)
    with pytest.raises(ValueError, match="proximal"):
        CCPReinitialization(model, proxies.proxies, x, y, lambda: 0.0, proximal=2.0)


def test_min_delta_counts_small_gains_as_plateau():
    x, y = _data()
    model, proxies = _model()
    scores = iter([0.5, 0.501, 0.502, 0.6])
    ccp = CCPReinitialization(model, proxies.proxies, x, y, validation_score=lambda: next(scores), patience=2,
                              pool_size=4, min_delta=0.01)
    model.fit(x, y, epochs=4, batch_size=20, verbose=0, callbacks=[ccp])
    assert ccp.reinitializations == 1  # epochs 2 and 3 gain less than min_delta


def test_plateau_is_judged_per_problem():
    x, y = _data()
    model, proxies = _model()
    # problem 1 peaks at 0.9; problem 2 starts low but keeps improving on its own best: no second re-init
    scores = iter([0.9, 0.8, 0.7, 0.3, 0.4, 0.5, 0.6])
    ccp = CCPReinitialization(model, proxies.proxies, x, y, validation_score=lambda: next(scores), patience=2,
                              pool_size=4)
    model.fit(x, y, epochs=7, batch_size=20, verbose=0, callbacks=[ccp])
    assert ccp.reinitializations == 1
