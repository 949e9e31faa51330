"""Metric-learning losses: hand-computed cases, pytorch-metric-learning as reference, training through model.fit."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from ot_layers import ClassProxies
from ot_layers.losses import (ContrastiveLoss, MultiSimilarityLoss, ProxyAnchorLoss, ProxyNCAPlusPlusLoss,
                              TripletLoss, ZeroShotPredictionLoss)


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


@pytest.mark.parametrize("loss", [ContrastiveLoss(), TripletLoss(), MultiSimilarityLoss(), ProxyAnchorLoss(),
                                  ProxyNCAPlusPlusLoss(), ZeroShotPredictionLoss()], ids=lambda loss: loss.name)
def test_batch_level_losses_refuse_per_sample_weights(loss):
    """Each of these losses is one value for the whole batch, which Keras multiplies by the mean of the weights
    (``[1, 1, 1, 1, 1, 0]``: 5/6 of the loss): they took weights that way, silently. Now ``sample_weight`` (``fit``'s ``class_weight`` too) is
    refused in one line naming it; without weights nothing changes."""
    x, labels = _batch()
    inputs = keras.Input((8,))
    output = "packed" if isinstance(loss, ZeroShotPredictionLoss) else "similarities"
    if isinstance(loss, (ContrastiveLoss, TripletLoss, MultiSimilarityLoss)):
        model = keras.Model(inputs, keras.layers.Dense(4)(inputs))
    else:
        model = keras.Model(inputs, ClassProxies(4, dim=8 if output == "similarities" else 4, output=output)(inputs))
    model.compile("sgd", loss)
    model.fit(x, labels, epochs=1, verbose=0)
    predictions = model.predict(x, verbose=0)
    weights = np.ones(len(labels))
    with pytest.raises(ValueError, match=rf"^`sample_weight`: {type(loss).__name__} is one value for the whole batch"):
        loss(labels, predictions, sample_weight=weights)
    with pytest.raises(ValueError, match=r"^`sample_weight`: .* \(sample_weight, class_weight\)"):
        model.fit(x, labels, epochs=1, verbose=0, class_weight={k: 1.0 + k for k in range(4)})


@pytest.mark.parametrize("loss_class", [ContrastiveLoss, TripletLoss, MultiSimilarityLoss, ProxyAnchorLoss,
                                        ProxyNCAPlusPlusLoss, ZeroShotPredictionLoss], ids=lambda c: c.__name__)
def test_batch_level_losses_refuse_per_sample_reduction(loss_class):
    """``reduction="none"`` asks for per-sample values, which these losses do not have: they returned their one batch
    value instead, silently. ``"sum"`` of one value is that value."""
    for reduction in ("none", None):
        with pytest.raises(ValueError, match=rf"^`reduction`: {loss_class.__name__} is one value for the whole batch"):
            loss_class(reduction=reduction)
    x, labels = _batch()
    if loss_class in (ContrastiveLoss, TripletLoss, MultiSimilarityLoss):
        predictions = x
    else:
        predictions = ClassProxies(4, dim=8 if loss_class is not ZeroShotPredictionLoss else 4,
                                   output="packed" if loss_class is ZeroShotPredictionLoss else "similarities")(x)
    np.testing.assert_allclose(float(loss_class(reduction="sum")(labels, predictions)),
                               float(loss_class()(labels, predictions)), rtol=1e-6)


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


def _with_a_nan_row(x):
    x = x.copy()
    x[2] = np.nan
    return x


@pytest.mark.parametrize("poison", [lambda x: np.full_like(x, np.nan), _with_a_nan_row,
                                    lambda x: np.where(np.arange(x.size).reshape(x.shape) == 5, np.inf, x)],
                         ids=["all_nan", "one_nan_row", "one_inf"])
@pytest.mark.parametrize("run", ["eager", "graph", "xla"])
def test_multi_similarity_of_non_finite_embeddings_is_not_finite(poison, run):
    """NaN similarities failed every mining comparison and dropped out of the loss: all-NaN embeddings gave 0 and a
    NaN row a finite loss, so a diverged run read as loss 0 (contrastive and triplet gave NaN). Checked in a graph
    and under XLA too, whose optimizers could fold a `0 * x` away."""
    x, y = _batch(0)
    loss = MultiSimilarityLoss()
    call = {"eager": loss, "graph": tf.function(loss.__call__),
            "xla": tf.function(loss.__call__, jit_compile=True)}[run]
    assert np.isfinite(float(call(y, x)))
    assert not np.isfinite(float(call(y, poison(x))))
    for other in (ContrastiveLoss(), TripletLoss()):  # the pair losses did already
        assert not np.isfinite(float(other(y, poison(x))))


def test_multi_similarity_value_and_gradient_on_finite_input_unchanged():
    """The non-finite check selects per anchor, so on finite input the value and gradient are those of the
    documented formula (written here in TensorFlow, without the check)."""
    x, y = _batch(2)
    x = tf.constant(x)
    alpha, beta, base, margin = 2.0, 50.0, 0.5, 0.1

    def formula(x):
        xn = tf.math.l2_normalize(x, axis=1)
        s = xn @ tf.transpose(xn)
        same = y[:, None] == y[None, :]
        positive, negative = same & ~np.eye(len(y), dtype=bool), ~same
        hardest_negative = tf.reduce_max(tf.where(negative, s, -np.inf), axis=1, keepdims=True)
        hardest_positive = tf.reduce_min(tf.where(positive, s, np.inf), axis=1, keepdims=True)
        kept_positive = positive & (s - margin < hardest_negative)
        kept_negative = negative & (s + margin > hardest_positive)
        pos = tf.math.log1p(tf.reduce_sum(tf.where(kept_positive, tf.exp(-alpha * (s - base)), 0.0), 1)) / alpha
        neg = tf.math.log1p(tf.reduce_sum(tf.where(kept_negative, tf.exp(beta * (s - base)), 0.0), 1)) / beta
        return tf.reduce_mean(pos + neg)

    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ours, expected = MultiSimilarityLoss()(y, x), formula(x)
    np.testing.assert_allclose(float(ours), float(expected), rtol=1e-5)
    np.testing.assert_allclose(tape.gradient(ours, x), tape.gradient(expected, x), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("outside", [-1, 4, 7])
def test_proxy_nca_label_outside_the_classes_contributes_zero(outside):
    """As ManifoldProxyLoss and HypersphericalPullLoss: the sample adds 0 to the batch mean, with a zero gradient.
    TensorFlow's sparse cross-entropy raised InvalidArgumentError on the CPU (and gave NaN rows on a GPU)."""
    x, y = _batch(4)
    similarities = tf.constant(_similarities(x, np.random.default_rng(4).normal(size=(4, 2, 8))))
    bad = y.copy()
    bad[[1, 6]] = outside
    known = bad != outside
    loss = ProxyNCAPlusPlusLoss(temperature=0.1)
    per_sample = [float(loss(y[i:i + 1], similarities[i:i + 1])) for i in range(len(y))]
    for call in (loss, tf.function(loss.__call__, jit_compile=True)):
        with tf.GradientTape() as tape:
            tape.watch(similarities)
            value = call(bad, similarities)
        np.testing.assert_allclose(float(value), np.sum(np.array(per_sample)[known]) / len(y), rtol=1e-5)
        gradient = tape.gradient(value, similarities).numpy()
        assert np.all(np.isfinite(gradient)) and np.all(gradient[~known] == 0) and np.any(gradient[known] != 0)


@pytest.mark.parametrize("shape, expected", [
    ((6, 1, 2), r"with num_classes >= 2, got shape \(6, 1, 2\)"),  # one class: the cross-entropy is always 0
    ((6, 4), r"must be the \(B, num_classes, num_proxies\) similarities .*got shape \(6, 4\)\.$"),
])
def test_proxy_nca_names_y_pred_without_two_classes(shape, expected):
    with pytest.raises(ValueError, match=f"^`y_pred` of ProxyNCAPlusPlusLoss .*{expected}"):
        ProxyNCAPlusPlusLoss()(np.zeros(6, np.int32), np.zeros(shape, np.float32))
    assert float(ProxyAnchorLoss()(np.zeros(6, np.int32), np.zeros((6, 1, 2), np.float32))) > 0  # one class: fine


@pytest.mark.parametrize("loss_class", ["ContrastiveLoss", "TripletLoss", "MultiSimilarityLoss", "ProxyAnchorLoss",
                                        "ProxyNCAPlusPlusLoss", "ZeroShotPredictionLoss", "HypersphericalPullLoss",
                                        "ManifoldProxyLoss"])
def test_a_float64_loss_reads_back_as_float64(loss_class):
    """Keras' ``Loss.get_config`` keeps only name and reduction: the loss read back computed in float32."""
    from ot_layers import losses
    loss = getattr(losses, loss_class)(dtype="float64")
    assert loss.dtype == "float64"
    assert type(loss).from_config(loss.get_config()).dtype == "float64"
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert type(restored) is type(loss) and restored.dtype == "float64"
    assert getattr(losses, loss_class)().dtype == "float32"
    assert "dtype" not in getattr(losses, loss_class)().get_config()  # the default: the reader's floatx


def _pull_reference(labels, logits):  # (1 - s_y)^2 (Saadabadi et al. 2024, Eq. 6)
    return (1.0 - logits[np.arange(len(labels)), labels]) ** 2


def _manifold_reference(labels, similarities, margin=5e-4):  # log(1 + sum_{j != k} exp(s_j - s_k + m))
    own = similarities[np.arange(len(labels)), labels][:, None]
    others = np.exp(similarities - own + margin)
    others[np.arange(len(labels)), labels] = 0.0
    return np.log1p(others.sum(1))


@pytest.mark.parametrize("loss_class, reference", [("HypersphericalPullLoss", _pull_reference),
                                                   ("ManifoldProxyLoss", _manifold_reference)])
def test_a_float64_per_sample_loss_computes_in_float64(loss_class, reference):
    """A float64 loss keeps float64 precision (it used to compute in float32 and cast back: errors of ~1e-8)."""
    from ot_layers import losses
    rng = np.random.default_rng(7)
    labels, scores = rng.integers(0, 5, 9), rng.uniform(-1.0, 1.0, (9, 5)) + 1e-9 * rng.normal(size=(9, 5))
    per_sample = getattr(losses, loss_class)(dtype="float64", reduction="none")(labels, scores)
    assert per_sample.dtype == tf.float64
    np.testing.assert_allclose(per_sample.numpy(), reference(labels, scores), rtol=1e-13, atol=1e-15)
    mean = getattr(losses, loss_class)(dtype="float64")(labels, scores)
    np.testing.assert_allclose(float(mean), reference(labels, scores).mean(), rtol=1e-13)
