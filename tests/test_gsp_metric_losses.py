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


def test_contrastive_hand_computed():
    # Two classes on the unit circle: x0=(1,0), x1=(0,1) same class; x2=(-1,0) other class.
    x = np.array([[1, 0], [0, 1], [-1, 0]], np.float32)
    y = np.array([0, 0, 1])
    d01, d02, d12 = np.sqrt(2), 2.0, np.sqrt(2)
    loss = ContrastiveLoss(pos_margin=0.5, neg_margin=1.5)(y, x)
    expected_pos = d01 - 0.5  # both ordered positive pairs have the same distance
    expected_neg = (2 * max(1.5 - d02, 0) + 2 * max(1.5 - d12, 0)) / 4
    np.testing.assert_allclose(float(loss), expected_pos + expected_neg, rtol=1e-5)


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
    with pytest.raises(ValueError, match="proxy_layer"):
        ProxyAnchorLoss(proxy_layer="not a layer")


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
    layer = _proxy_layer(proxies)
    tx, ty = torch.tensor(x), torch.tensor(y.astype(np.int64))

    ref_anchor = losses.ProxyAnchorLoss(num_classes=4, embedding_size=8, margin=0.1, alpha=32)
    ref_anchor.proxies.data = torch.tensor(proxies[:, 0])
    np.testing.assert_allclose(float(ProxyAnchorLoss(layer)(y, x)), float(ref_anchor(tx, ty)), rtol=1e-4)

    ref_nca = losses.ProxyNCALoss(num_classes=4, embedding_size=8, softmax_scale=1 / 0.1)
    ref_nca.proxies.data = torch.tensor(proxies[:, 0])
    np.testing.assert_allclose(float(ProxyNCAPlusPlusLoss(layer, temperature=0.1)(y, x)),
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
    ours = ProxyNCAPlusPlusLoss(_proxy_layer(proxies), temperature=0.1)(y, x)
    np.testing.assert_allclose(float(ours), expected, rtol=1e-4)


@pytest.mark.parametrize("loss_name", ["proxy_anchor", "proxy_nca_pp"])
def test_proxy_loss_trains_proxies_in_fit(loss_name):
    x, y = _batch(0, classes=4, per_class=8)
    proxies = ClassProxies(4, 2, name="proxies")
    inputs = keras.Input((8,))
    model = keras.Model(inputs, proxies(keras.layers.Dense(8)(inputs)))
    loss = ProxyAnchorLoss(proxies) if loss_name == "proxy_anchor" else ProxyNCAPlusPlusLoss(proxies)
    assert loss.proxies is proxies.proxies and tuple(loss.proxies.shape) == (4, 2, 8)
    before = np.array(loss.proxies)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss, jit_compile=True)
    history = model.fit(x, y, epochs=3, batch_size=32, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert not np.allclose(before, np.array(loss.proxies))
