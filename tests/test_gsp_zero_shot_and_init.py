"""Zero-shot prediction loss (Gurbuz 2022 thesis, Eq. 5.2.4) and the GSP prototype-initialization callback."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from ot_layers import ClassProxies, GeneralizedSumPooling
from ot_layers.callbacks import GSPPrototypeInit
from ot_layers.losses import ZERO_SHOT_WEIGHT, ProxyNCAPlusPlusLoss, ZeroShotPredictionLoss
from ot_layers.losses.zero_shot import disjoint_class_halves


def _class_embeddings(upsilon, attributes_dim):
    layer = ClassProxies(upsilon.shape[0], 1, dim=upsilon.shape[1], output="packed")
    layer.build((None, attributes_dim))
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


@pytest.mark.parametrize("m,dv", [(6, 5), (4, 9)])  # pseudo-attributes wider or narrower than the embeddings
def test_matches_a_direct_numpy_implementation(m, dv):
    rng = np.random.default_rng(0)
    labels = np.repeat(rng.permutation(7)[:4], 3).astype(np.int32)
    z = rng.dirichlet(np.ones(m), size=len(labels))
    upsilon = rng.normal(size=(7, dv)).astype(np.float32)
    packed = _class_embeddings(upsilon, m)(z.astype(np.float32))
    assert tuple(packed.shape) == (len(labels), 8, max(m, dv))
    loss = ZeroShotPredictionLoss(ridge=0.05, scale=9.5)
    expected = _reference(z, labels, upsilon.astype(np.float64), 0.05, 9.5)
    np.testing.assert_allclose(float(loss(labels, packed)), expected, rtol=1e-3)


def test_halves_have_disjoint_classes():
    labels = tf.constant([5, 5, 2, 2, 9, 9, 0, 0, 3, 3])
    first = disjoint_class_halves(labels).numpy()
    a, b = set(labels.numpy()[first]), set(labels.numpy()[~first])
    assert a and b and not a & b


def test_halves_split_the_distinct_classes_however_the_samples_spread():
    """A split at the median sample left b1 empty when the lowest class held half the batch ([0, 0, 0, 1, 1]): the
    loss was log(C) with no gradient. The halves split the distinct classes (lower D // 2 of them in b1)."""
    rng = np.random.default_rng(3)
    for labels in ([0, 0, 0, 1, 1], [4, 4, 4, 4, 1], [0, 0, 0, 1, 2], [7, 7], [2, 9, 2, 9, 9, 9, 9]):
        first = disjoint_class_halves(tf.constant(labels)).numpy()
        distinct = np.unique(labels)
        np.testing.assert_array_equal(first, np.isin(labels, distinct[:len(distinct) // 2]))
        assert first.any() == (len(distinct) >= 2)
    for _ in range(20):
        labels = rng.integers(0, rng.integers(1, 8), size=rng.integers(1, 20))
        known = rng.random(len(labels)) < 0.7
        first = disjoint_class_halves(tf.constant(labels), tf.constant(known)).numpy()
        distinct = np.unique(labels[known])
        np.testing.assert_array_equal(first, known & np.isin(labels, distinct[:len(distinct) // 2]))
    z = tf.Variable(rng.random((5, 4)).astype(np.float32))
    upsilon = tf.Variable(rng.standard_normal((3, 4)).astype(np.float32))
    with tf.GradientTape() as tape:
        packed = tf.concat([z[:, None, :], tf.broadcast_to(upsilon[None], (5, 3, 4))], axis=1)
        value = ZeroShotPredictionLoss()(np.array([0, 0, 0, 1, 1]), packed)
    assert abs(float(value) - np.log(3)) > 1e-3 and float(tf.norm(tape.gradient(value, z))) > 0


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="ridge"):
        ZeroShotPredictionLoss(ridge=0.0)
    with pytest.raises(ValueError, match="scale"):
        ZeroShotPredictionLoss(scale=-1.0)
    with pytest.raises(ValueError, match="y_pred"):  # the pseudo-attributes alone, not the packed output
        ZeroShotPredictionLoss()(np.arange(4), np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match="output"):
        ClassProxies(3, output="embeddings")
    with pytest.raises(ValueError, match="num_proxies"):
        ClassProxies(3, num_proxies=0)


def _packed_batch(seed=5, classes=5, per_class=3, m=6, dv=4):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), per_class).astype(np.int32)
    z = rng.dirichlet(np.ones(m), size=len(labels))
    upsilon = rng.normal(size=(classes, dv)).astype(np.float32)
    return labels, np.asarray(_class_embeddings(upsilon, m)(z.astype(np.float32)))


@pytest.mark.parametrize("outside", [-1, 5, 12])
def test_a_label_outside_the_classes_contributes_zero(outside):
    """As ManifoldProxyLoss and HypersphericalPullLoss: the sample is in neither half (neither fits a ridge map nor
    is classified), so the loss is that of the batch without it, with a zero gradient to its row. A gather with it
    raised TensorFlow's GatherV2 / SparseSoftmaxCrossEntropy error on the CPU (a GPU gather gives zeros)."""
    labels, packed = _packed_batch()
    bad = labels.copy()
    bad[[2, 4, 9]] = outside  # a sample of classes 0, 1 and 3 each
    known = bad != outside
    loss = ZeroShotPredictionLoss()
    expected = float(loss(labels[known], packed[known]))
    packed = tf.constant(packed)
    for call in (loss, tf.function(loss.__call__, jit_compile=True)):
        with tf.GradientTape() as tape:
            tape.watch(packed)
            value = call(bad, packed)
        np.testing.assert_allclose(float(value), expected, rtol=1e-5)
        gradient = tape.gradient(value, packed).numpy()
        assert np.all(np.isfinite(gradient)) and np.all(gradient[~known, 0] == 0)
        assert np.any(gradient[known, 0] != 0)


def test_halves_leave_out_the_samples_not_known():
    labels = tf.constant([5, -1, 2, 2, 9, 9, -1, 0, 0, 7])
    known = labels.numpy() >= 0
    first = disjoint_class_halves(labels, tf.constant(known)).numpy()
    assert not np.any(first[~known])
    # the median of the known labels [0, 0, 2, 2, 5, 7, 9, 9]: the first half is that of the batch without them
    np.testing.assert_array_equal(first[known], disjoint_class_halves(labels[known]).numpy())
    np.testing.assert_array_equal(first[known], labels.numpy()[known] < 5)
    assert not np.any(disjoint_class_halves(labels, tf.zeros(10, tf.bool)).numpy())


@pytest.mark.parametrize("shape", [(4, 1, 5), (4, 2, 5)])
def test_y_pred_without_two_classes_is_named(shape):
    """(B, 1, D) (the pseudo-attributes without class rows) was taken; over one class the cross-entropy is 0."""
    with pytest.raises(ValueError, match=rf"^`y_pred` of ZeroShotPredictionLoss .* with num_classes >= 2, got "
                                         rf"shape \({shape[0]}, {shape[1]}, 5\)\.$"):
        ZeroShotPredictionLoss()(np.zeros(4, np.int32), np.zeros(shape, np.float32))


def _gsp_model(num_classes=4, attributes_dim=6, activation="relu"):
    inputs = keras.Input((6, 6, 3))
    features = keras.layers.Conv2D(8, 1, activation=activation, name="conv")(inputs)
    pooled, z = GeneralizedSumPooling(num_prototypes=5, epsilon=2.0, max_iter=20, return_attributes=True,
                                      name="gsp")(features)
    proxies = ClassProxies(num_classes, name="proxies")
    class_embeddings = ClassProxies(num_classes, dim=attributes_dim, output="packed", name="class_embeddings")
    similarities = proxies(keras.layers.Dense(8, name="embedding")(pooled))
    model = keras.Model(inputs, [similarities, class_embeddings(z)])
    return model, proxies, class_embeddings


def test_combined_loss_trains_class_embeddings():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 8).astype(np.int32)
    x = (rng.uniform(size=(32, 6, 6, 3)) + y[:, None, None, None] * 0.2).astype(np.float32)
    model, proxies, class_embeddings = _gsp_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=[ProxyNCAPlusPlusLoss(), ZeroShotPredictionLoss()],
                  loss_weights=[1 - ZERO_SHOT_WEIGHT, ZERO_SHOT_WEIGHT])
    before = np.array(class_embeddings.proxies)
    history = model.fit(x, [y, y], epochs=4, batch_size=32, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert not np.allclose(before, np.array(class_embeddings.proxies))  # the class embeddings are learned


def test_model_with_zero_shot_loss_reloaded_from_keras_file_continues_fit_without_recompiling(tmp_path):
    rng = np.random.default_rng(2)
    y = np.repeat(np.arange(4), 4).astype(np.int32)
    x = (rng.uniform(size=(16, 6, 6, 3)) + y[:, None, None, None] * 0.2).astype(np.float32)
    model, _, _ = _gsp_model()
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=[ProxyNCAPlusPlusLoss(), ZeroShotPredictionLoss()],
                  loss_weights=[1 - ZERO_SHOT_WEIGHT, ZERO_SHOT_WEIGHT])
    model.fit(x, [y, y], epochs=1, batch_size=16, verbose=0, shuffle=False)
    model.save(tmp_path / "model.keras")
    restored = keras.saving.load_model(tmp_path / "model.keras")
    for m in (model, restored):
        m.fit(x, [y, y], epochs=1, batch_size=16, verbose=0, shuffle=False)
    for a, b in zip(model.get_weights(), restored.get_weights()):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)


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

    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=[ProxyNCAPlusPlusLoss(), ZeroShotPredictionLoss()])
    init = GSPPrototypeInit(x, layer_name="gsp", warmup_epochs=1, num_features=200)
    model.fit(x, [y, y], epochs=1, batch_size=16, verbose=0, callbacks=[init, RecordFlag()])
    assert flags == [1.0, 1.0]  # GAP during the warm-up epoch
    assert init.initialized and float(gsp.average_pooling_warmup.numpy()) == 0.0
    assert float(gsp.warmup_epochs_done.numpy()) == 1.0
    features = keras.Model(model.inputs, gsp.input).predict(x, verbose=0).reshape(-1, 8)
    features = features / np.maximum(1.0, np.linalg.norm(features, axis=1, keepdims=True))
    prototypes = gsp.prototypes.numpy()
    distances = np.linalg.norm(prototypes[:, None] - features[None], axis=-1)
    np.testing.assert_allclose(distances.min(axis=1), 0.0, atol=1e-5)  # every prototype is a stored feature
    assert np.unique(prototypes, axis=0).shape[0] == 5
    # a second fit neither warms up again nor re-initializes
    flags.clear()
    model.fit(x, [y, y], epochs=1, batch_size=16, verbose=0, callbacks=[init, RecordFlag()])
    assert flags == [0.0, 0.0]


def test_prototype_init_finds_the_only_gsp_layer_and_rejects_bad_arguments():
    x = np.random.default_rng(3).uniform(size=(8, 6, 6, 3)).astype(np.float32)
    model, _, _ = _gsp_model()
    init = GSPPrototypeInit(x, warmup_epochs=0, num_features=100)
    init.set_model(model)
    init.on_epoch_begin(0)  # warmup_epochs=0: initialize at once
    assert init.initialized and float(model.get_layer("gsp").average_pooling_warmup.numpy()) == 0.0
    with pytest.raises(ValueError, match="layer_name"):
        bad = GSPPrototypeInit(x, layer_name="nope")
        bad.set_model(model)
        bad.on_epoch_begin(0)
    with pytest.raises(ValueError, match="warmup_epochs"):
        GSPPrototypeInit(x, warmup_epochs=-1)

def test_prototype_init_rejects_non_finite_images_and_features():
    """NaN or Inf pixels are refused when the callback is made (a backbone may hide them: max pooling and, by CPU
    kernel, ReLU drop NaN). Non-finite features of finite images (here pixels so large that a 1x1 convolution
    overflows float32) are refused when the prototypes would be set from them."""
    x = np.random.default_rng(3).uniform(size=(8, 6, 6, 3)).astype(np.float32)
    for bad in (np.nan, np.inf):
        images = x.copy()
        images[0, 0, 0, :] = bad
        with pytest.raises(ValueError, match="^`images` holds NaN or Inf"):
            GSPPrototypeInit(images, warmup_epochs=0)
    model, _, _ = _gsp_model(activation=None)
    huge = x.copy()
    huge[0] *= np.finfo(np.float32).max
    features = keras.Model(model.inputs, model.get_layer("gsp").input).predict(huge, verbose=0)
    assert not np.all(np.isfinite(features[0])) and np.all(np.isfinite(features[1:]))  # overflow by construction
    init = GSPPrototypeInit(huge, warmup_epochs=0)
    init.set_model(model)
    with pytest.raises(ValueError, match="images.*NaN or Inf"):
        init.on_epoch_begin(0)
    assert not init.initialized


@pytest.mark.parametrize("images, fails", [(1, True), (2, False)])
def test_prototype_init_refuses_images_with_fewer_local_features_than_prototypes_before_training(images, fails):
    """One 6x6 feature map gives 36 local features for 40 prototypes: accepted when training began, the callback
    failed only after the warm-up epochs were trained. Two (72) are enough."""
    rng = np.random.default_rng(0)
    inputs = keras.Input((6, 6, 3))
    model = keras.Model(inputs, GeneralizedSumPooling(num_prototypes=40, name="gsp")(keras.layers.Conv2D(8, 1)(inputs)))
    model.compile("sgd", loss=lambda y, e: keras.ops.mean(e))
    x = rng.uniform(size=(32, 6, 6, 3)).astype(np.float32)
    init = GSPPrototypeInit(x[:images], warmup_epochs=1, num_features=1024)
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    fit = dict(epochs=2, batch_size=16, verbose=0, callbacks=[init, counter])
    if fails:
        with pytest.raises(ValueError, match=r"^`images` give 36 local features \(1 image\(s\) x 36\), fewer than "
                                             r"the layer's 40 prototypes\.$"):
            model.fit(x, np.zeros(32), **fit)
        assert steps == [] and float(model.get_layer("gsp").warmup_epochs_done.numpy()) == 0.0
    else:
        model.fit(x, np.zeros(32), **fit)
        assert init.initialized


def test_packed_class_embeddings_are_one_per_class():
    """``ZeroShotPredictionLoss`` reads rows ``1..`` of the packed output as the classes: with 2 proxies per class
    it scored 3 classes as 6 (label k against class k // 2's proxy k % 2) without a word."""
    with pytest.raises(ValueError, match=r"^`num_proxies` must be 1 for output='packed'.*got 2\.$"):
        ClassProxies(3, num_proxies=2, dim=5, output="packed")
    layer = ClassProxies(3, num_proxies=1, dim=5, output="packed")
    assert tuple(layer(np.ones((2, 4), np.float32)).shape) == (2, 4, 5)
    assert ClassProxies(3, num_proxies=2, dim=4).num_proxies == 2  # the similarities output keeps several
