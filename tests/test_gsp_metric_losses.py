"""Metric-learning losses: hand-computed cases, pytorch-metric-learning as reference, training through model.fit."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from ot_layers import ClassProxies
from ot_layers.losses import (ContrastiveLoss, MultiSimilarityLoss, ProxyAnchorLoss, ProxyNCAPlusPlusLoss,
                              TripletLoss)


def _batch(seed=0, classes=4, per_class=4, dim=8):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), per_class).astype(np.int32)
    centers = rng.normal(size=(classes, dim))
    x = centers[labels] + 0.8 * rng.normal(size=(len(labels), dim))
    return x.astype(np.float32), labels


def _proxy_layer(proxies):
    layer = ClassProxies(proxies.shape[0], proxies.shape[1], dim=proxies.shape[2])
    layer.build((None, proxies.shape[2]))
    layer.proxies.assign(proxies)
    return layer


def _similarities(x, proxies):
    """The ``ClassProxies`` output computed in NumPy: cosines of ``x`` ``(B, d)`` to ``proxies`` ``(K, M, d)``."""
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    pn = proxies / np.linalg.norm(proxies, axis=2, keepdims=True)
    return np.einsum("bd,kmd->bkm", xn, pn).astype(np.float32)


def test_contrastive_hand_computed():
    # Two classes on the unit circle: x0=(1,0), x1=(0,1) same class; x2=(-1,0) other class.
    x = np.array([[1, 0], [0, 1], [-1, 0]], np.float32)
    y = np.array([0, 0, 1])
    d01, d02, d12 = np.sqrt(2), 2.0, np.sqrt(2)
    loss = ContrastiveLoss(pos_margin=0.5, neg_margin=1.5)(y, x)
    expected_pos = d01 - 0.5  # both ordered positive pairs have the same distance
    expected_neg = (2 * max(1.5 - d02, 0) + 2 * max(1.5 - d12, 0)) / 4
    np.testing.assert_allclose(float(loss), expected_pos + expected_neg, rtol=1e-5)


def test_contrastive_without_normalization_uses_raw_distances():
    x = np.array([[0, 0], [0, 3], [4, 0]], np.float32)
    y = np.array([0, 0, 1])
    loss = ContrastiveLoss(pos_margin=1.0, neg_margin=4.5, normalize=False)(y, x)
    # positive pair distance 3; negative distances 4 and 5
    np.testing.assert_allclose(float(loss), (3 - 1) + (0.5 + 0) / 2, rtol=1e-5)


def test_triplet_hand_computed():
    x = np.array([[1, 0], [0, 1], [-1, 0]], np.float32)
    y = np.array([0, 0, 1])
    # triplets (a=0, p=1, n=2): sqrt2 - 2 + m; (a=1, p=0, n=2): sqrt2 - sqrt2 + m
    margin = 0.7
    values = [np.sqrt(2) - 2 + margin, margin]
    active = [v for v in values if v > 0]
    np.testing.assert_allclose(float(TripletLoss(margin=margin)(y, x)), np.mean(active), rtol=1e-5)


def test_losses_reject_bad_arguments():
    with pytest.raises(ValueError, match="margin"):
        TripletLoss(margin=0.0)
    with pytest.raises(ValueError, match="alpha"):
        MultiSimilarityLoss(alpha=-1.0)
    with pytest.raises(ValueError, match="mining_margin"):
        MultiSimilarityLoss(mining_margin=-0.1)
    with pytest.raises(ValueError, match="temperature"):
        ProxyNCAPlusPlusLoss(temperature=0.0)
    with pytest.raises(ValueError, match="y_pred"):  # embeddings instead of the ClassProxies similarities
        ProxyAnchorLoss()(np.arange(3), np.ones((3, 4), np.float32))


def test_gradients_finite_with_duplicate_embeddings():
    x = tf.constant(np.array([[1, 0], [1, 0], [0, 1], [0, 1]], np.float32))
    y = np.array([0, 0, 1, 1])
    for loss in (ContrastiveLoss(), TripletLoss(), MultiSimilarityLoss()):
        with tf.GradientTape() as tape:
            tape.watch(x)
            value = loss(y, x)
        assert np.all(np.isfinite(tape.gradient(value, x).numpy())), loss.name


@pytest.fixture(scope="module")
def pml():
    torch = pytest.importorskip("torch")
    losses = pytest.importorskip("pytorch_metric_learning.losses")
    miners = pytest.importorskip("pytorch_metric_learning.miners")
    reducers = pytest.importorskip("pytorch_metric_learning.reducers")
    return torch, losses, miners, reducers


@pytest.mark.parametrize("seed", [0, 1])
def test_pair_losses_match_pytorch_metric_learning(pml, seed):
    torch, losses, miners, reducers = pml
    x, y = _batch(seed)
    tx, ty = torch.tensor(x), torch.tensor(y.astype(np.int64))
    ref = losses.ContrastiveLoss(pos_margin=0.25, neg_margin=0.9, reducer=reducers.MeanReducer())(tx, ty)
    ours = ContrastiveLoss(pos_margin=0.25, neg_margin=0.9)(y, x)
    np.testing.assert_allclose(float(ours), float(ref), rtol=1e-4)

    ref = losses.TripletMarginLoss(margin=0.3)(tx, ty)
    np.testing.assert_allclose(float(TripletLoss(margin=0.3)(y, x)), float(ref), rtol=1e-4)

    pairs = miners.MultiSimilarityMiner(epsilon=0.1)(tx, ty)
    ref = losses.MultiSimilarityLoss(alpha=2, beta=50, base=0.5)(tx, ty, pairs)
    np.testing.assert_allclose(float(MultiSimilarityLoss()(y, x)), float(ref), rtol=1e-4)


@pytest.mark.parametrize("seed", [0, 1])
def test_proxy_losses_match_pytorch_metric_learning(pml, seed):
    torch, losses, _, _ = pml
    x, y = _batch(seed)
    proxies = np.random.default_rng(seed + 10).normal(size=(4, 1, 8)).astype(np.float32)
    similarities = _proxy_layer(proxies)(x)
    np.testing.assert_allclose(similarities, _similarities(x, proxies), atol=1e-6)
    tx, ty = torch.tensor(x), torch.tensor(y.astype(np.int64))

    ref_anchor = losses.ProxyAnchorLoss(num_classes=4, embedding_size=8, margin=0.1, alpha=32)
    ref_anchor.proxies.data = torch.tensor(proxies[:, 0])
    np.testing.assert_allclose(float(ProxyAnchorLoss()(y, similarities)), float(ref_anchor(tx, ty)), rtol=1e-4)

    ref_nca = losses.ProxyNCALoss(num_classes=4, embedding_size=8, softmax_scale=1 / 0.1)
    ref_nca.proxies.data = torch.tensor(proxies[:, 0])
    np.testing.assert_allclose(float(ProxyNCAPlusPlusLoss(temperature=0.1)(y, similarities)),
                               float(ref_nca(tx, ty)), rtol=1e-4)


def test_multi_proxy_losses_use_nearest_and_all_proxies():
    x, y = _batch(3)
    proxies = np.random.default_rng(3).normal(size=(4, 3, 8)).astype(np.float32)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    pn = proxies / np.linalg.norm(proxies, axis=2, keepdims=True)
    cos = np.einsum("bd,kmd->bkm", xn, pn)
    logits = -(2 - 2 * cos.max(-1)) / 0.1
    logits -= logits.max(1, keepdims=True)
    expected = np.mean(-(logits[np.arange(len(y)), y] - np.log(np.exp(logits).sum(1))))
    ours = ProxyNCAPlusPlusLoss(temperature=0.1)(y, _proxy_layer(proxies)(x))
    np.testing.assert_allclose(float(ours), expected, rtol=1e-4)
    # Proxy-Anchor with several proxies per class: every proxy is an anchor labelled by its class
    alpha, delta = 32.0, 0.1
    s = cos.reshape(len(y), -1)
    proxy_labels = np.repeat(np.arange(4), 3)
    positive = y[:, None] == proxy_labels[None, :]
    pos = [np.log1p(np.exp(-alpha * (s[positive[:, p], p] - delta)).sum()) for p in range(12) if positive[:, p].any()]
    neg = [np.log1p(np.exp(alpha * (s[~positive[:, p], p] + delta)).sum()) for p in range(12)]
    np.testing.assert_allclose(float(ProxyAnchorLoss()(y, cos.astype(np.float32))), np.mean(pos) + np.mean(neg),
                               rtol=1e-4)


def _proxy_model(num_proxies=2):
    inputs = keras.Input((8,))
    embedding = keras.layers.Dense(8, name="embed")(inputs)
    return keras.Model(inputs, ClassProxies(4, num_proxies, name="proxies")(embedding))


LOSSES = {"proxy_anchor": lambda: ProxyAnchorLoss(margin=0.2), "proxy_nca_pp": lambda: ProxyNCAPlusPlusLoss(0.2)}


@pytest.mark.parametrize("loss_name", sorted(LOSSES))
def test_proxy_loss_trains_proxies_in_fit(loss_name):
    x, y = _batch(0, classes=4, per_class=8)
    model = _proxy_model()
    proxies = model.get_layer("proxies").proxies
    assert tuple(proxies.shape) == (4, 2, 8)
    before = np.array(proxies)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=LOSSES[loss_name](), jit_compile=True)
    history = model.fit(x, y, epochs=3, batch_size=32, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert not np.allclose(before, np.array(proxies))


@pytest.mark.parametrize("loss_name", sorted(LOSSES))
def test_compiled_model_reloaded_from_keras_file_continues_fit_without_recompiling(loss_name, tmp_path):
    x, y = _batch(1, classes=4, per_class=4)
    model = _proxy_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=LOSSES[loss_name]())
    model.fit(x, y, epochs=1, batch_size=16, verbose=0, shuffle=False)  # the optimizer has state now
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    assert type(restored.loss) is type(model.loss) and restored.loss.get_config() == model.loss.get_config()
    for m in (model, restored):  # the same next step: same weights, optimizer state and loss
        m.fit(x, y, epochs=1, batch_size=16, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), restored.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    np.testing.assert_allclose(restored.evaluate(x, y, verbose=0), model.evaluate(x, y, verbose=0), rtol=1e-6)
