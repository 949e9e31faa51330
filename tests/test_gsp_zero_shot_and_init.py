"""Zero-shot prediction loss (Eq. 5.2.4) and the GSP prototype-initialization callback."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from ot_layers import ClassProxies, GeneralizedSumPooling
from ot_layers.callbacks import GSPPrototypeInit
from ot_layers.losses import ZERO_SHOT_WEIGHT, ProxyNCAPlusPlusLoss, ZeroShotPredictionLoss
from ot_layers.losses.zero_shot import disjoint_class_halves


def _class_embeddings(upsilon):
    layer = ClassProxies(upsilon.shape[0], 1, dim=upsilon.shape[1])
    layer.build((None, 3))
    layer.proxies.assign(upsilon[:, None, :])
    return layer


def _reference(z, labels, upsilon, ridge, scale):
    first = labels < np.sort(labels)[len(labels) // 2]
    total = 0.0
    for fit, evaluate in ((first, ~first), (~first, first)):
        zb, vb = z[fit].T, upsilon[labels[fit]].T  # columns are samples
        a = vb @ np.linalg.inv(zb.T @ zb + ridge * np.eye(zb.shape[1])) @ zb.T
        logits = scale * (z[evaluate] @ a.T) @ upsilon.T
        logits -= logits.max(1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        total += -np.mean(log_p[np.arange(evaluate.sum()), labels[evaluate]])
    return total


def test_matches_a_direct_numpy_implementation():
    rng = np.random.default_rng(0)
    labels = np.repeat(rng.permutation(7)[:4], 3).astype(np.int32)
    z = rng.dirichlet(np.ones(6), size=len(labels))
    upsilon = rng.normal(size=(7, 5)).astype(np.float32)
    loss = ZeroShotPredictionLoss(_class_embeddings(upsilon), ridge=0.05, logit_scale=9.5)
    expected = _reference(z, labels, upsilon.astype(np.float64), 0.05, 9.5)
    np.testing.assert_allclose(float(loss(labels, z.astype(np.float32))), expected, rtol=1e-3)


def test_halves_have_disjoint_classes():
    labels = tf.constant([5, 5, 2, 2, 9, 9, 0, 0, 3, 3])
    first = disjoint_class_halves(labels).numpy()
    a, b = set(labels.numpy()[first]), set(labels.numpy()[~first])
    assert a and b and not a & b


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="class_embeddings"):
        ZeroShotPredictionLoss(class_embeddings="class_embeddings")
    with pytest.raises(ValueError, match="ridge"):
        ZeroShotPredictionLoss(_class_embeddings(np.ones((2, 2), np.float32)), ridge=0.0)


def _gsp_model(num_classes=4, attributes_dim=6):
    inputs = keras.Input((6, 6, 3))
    features = keras.layers.Conv2D(8, 1, activation="relu", name="conv")(inputs)
    pooled, z = GeneralizedSumPooling(num_prototypes=5, inverse_temperature=0.5, max_iter=20,
                                      return_attributes=True, name="gsp")(features)
    proxies = ClassProxies(num_classes, name="proxies")
    class_embeddings = ClassProxies(num_classes, dim=attributes_dim, name="class_embeddings")
    embedding = proxies(keras.layers.Dense(8, name="embedding")(pooled))
    model = keras.Model(inputs, [embedding, class_embeddings(z)])
    return model, proxies, class_embeddings


def test_combined_loss_trains_class_embeddings():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 8).astype(np.int32)
    x = (rng.uniform(size=(32, 6, 6, 3)) + y[:, None, None, None] * 0.2).astype(np.float32)
    model, proxies, class_embeddings = _gsp_model()
    zs = ZeroShotPredictionLoss(class_embeddings)
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=[ProxyNCAPlusPlusLoss(proxies), zs],
                  loss_weights=[1 - ZERO_SHOT_WEIGHT, ZERO_SHOT_WEIGHT])
    before = np.array(zs.proxies)
    history = model.fit(x, [y, y], epochs=4, batch_size=32, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert not np.allclose(before, np.array(zs.proxies))  # the class embeddings are learned


def test_prototype_init_callback_warms_up_then_picks_k_centers():
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(4), 8).astype(np.int32)
    x = rng.uniform(size=(32, 6, 6, 3)).astype(np.float32)
    model, proxies, class_embeddings = _gsp_model()
    gsp = model.get_layer("gsp")
    flags = []

    class RecordFlag(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            flags.append(float(gsp.average_pooling_warmup.numpy()))

    model.compile(optimizer=keras.optimizers.Adam(1e-2),
                  loss=[ProxyNCAPlusPlusLoss(proxies), ZeroShotPredictionLoss(class_embeddings)])
    init = GSPPrototypeInit("gsp", x, warmup_epochs=1, num_features=200)
    model.fit(x, [y, y], epochs=1, batch_size=16, verbose=0, callbacks=[init, RecordFlag()])
    assert flags == [1.0, 1.0]  # GAP during the warm-up epoch
    assert init.initialized and float(gsp.average_pooling_warmup.numpy()) == 0.0
    features = keras.Model(model.inputs, gsp.input).predict(x, verbose=0).reshape(-1, 8)
    features = features / np.maximum(1.0, np.linalg.norm(features, axis=1, keepdims=True))
    prototypes = gsp.prototypes.numpy()
    distances = np.linalg.norm(prototypes[:, None] - features[None], axis=-1)
    np.testing.assert_allclose(distances.min(axis=1), 0.0, atol=1e-5)  # every prototype is a stored feature
    assert np.unique(prototypes, axis=0).shape[0] == 5
