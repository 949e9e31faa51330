"""GeneralizedSumPooling: semantics, gradients w.r.t. prototypes and features, and the Keras checks."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from ot_layers import GeneralizedSumPooling
import keras_checks


def _features(seed=0, shape=(3, 4, 4, 5)):
    return np.random.default_rng(seed).uniform(0.0, 1.0, size=shape).astype(np.float32)


def _built(layer, shape, seed=1):
    layer.build(shape)
    rng = np.random.default_rng(seed)
    layer.prototypes.assign(rng.uniform(0, 1, size=tuple(layer.prototypes.shape)).astype(layer.prototypes.dtype))
    return layer


def test_shapes_and_pseudo_attributes():
    x = _features()
    layer = _built(GeneralizedSumPooling(num_prototypes=6, return_attributes=True), x.shape)
    pooled, z = layer(x)
    assert pooled.shape == (3, 5) and z.shape == (3, 6)
    np.testing.assert_allclose(tf.reduce_sum(z, axis=-1), 1.0, atol=1e-5)
    flat = _built(GeneralizedSumPooling(num_prototypes=6), (3, 16, 5))
    flat.prototypes.assign(layer.prototypes)
    np.testing.assert_allclose(flat(x.reshape(3, 16, 5)), pooled, atol=1e-6)


def test_ratio_one_is_exactly_average_pooling():
    x = _features(1)
    layer = _built(GeneralizedSumPooling(num_prototypes=4, transport_ratio=1.0), x.shape)
    np.testing.assert_allclose(layer(x), x.mean(axis=(1, 2)), atol=1e-6)


def test_warmup_flag_gives_average_pooling():
    x = _features(2)
    layer = _built(GeneralizedSumPooling(num_prototypes=4), x.shape)
    assert not np.allclose(layer(x), x.mean(axis=(1, 2)), atol=1e-4)
    layer.average_pooling_warmup.assign(1.0)
    np.testing.assert_allclose(layer(x), x.mean(axis=(1, 2)), atol=1e-6)


def test_selects_the_elements_closest_to_the_prototypes():
    # The thesis' toy (Fig. 5.2): a 10x10 RGB map, a red and a blue 5x5 block on green; red and blue prototypes.
    image = np.zeros((10, 10, 3), np.float32)
    image[..., 1] = 1.0
    image[:5, :5] = (1, 0, 0)
    image[5:, 5:] = (0, 0, 1)
    layer = GeneralizedSumPooling(num_prototypes=2, transport_ratio=0.5, epsilon=0.1)
    layer.build((1, 10, 10, 3))
    layer.prototypes.assign(np.array([[1, 0, 0], [0, 0, 1]], np.float32))
    pooled = layer(image[None]).numpy()[0]
    np.testing.assert_allclose(pooled, [0.5, 0.0, 0.5], atol=1e-2)  # GAP would give (0.25, 0.5, 0.25)
    # The public pooling weights: the 50 red and blue pixels get 1/50 each, the green ones none; the plan sends
    # the red pixels to the red prototype (row 0) and the blue ones to the blue prototype (row 1).
    weights, plan = layer.pooling_weights(tf.constant(image.reshape(1, 100, 3)))
    coloured = (image[..., 1] == 0).reshape(100)
    np.testing.assert_allclose(weights.numpy()[0][coloured], 1 / 50, atol=2e-4)
    np.testing.assert_allclose(weights.numpy()[0][~coloured], 0.0, atol=2e-4)
    red, blue = (image[..., 0] == 1).reshape(100), (image[..., 2] == 1).reshape(100)
    np.testing.assert_allclose(plan.numpy()[0, 0, red].sum(), 0.25, atol=2e-3)
    np.testing.assert_allclose(plan.numpy()[0, 1, blue].sum(), 0.25, atol=2e-3)


def _layer_gradients(gradient, x, prototypes, ratio, epsilon, max_iter):
    layer = GeneralizedSumPooling(num_prototypes=prototypes.shape[0], transport_ratio=ratio, epsilon=epsilon,
                                  max_iter=max_iter, threshold=0, gradient=gradient, return_attributes=True,
                                  dtype="float64")
    layer.build(x.shape)
    layer.prototypes.assign(prototypes)
    weights = tf.constant(np.random.default_rng(9).normal(size=(x.shape[0], x.shape[-1])))

    @tf.function
    def gradients(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            pooled, z = layer(x)
            value = tf.reduce_sum(pooled * weights) + tf.reduce_sum(tf.square(z[:, :2]))
        return tape.gradient(value, [x, layer.prototypes])

    return [g.numpy() for g in gradients(x)]


@pytest.mark.parametrize("ratio,epsilon", [(0.3, 0.2), (0.3, 2.0)])
def test_implicit_gradients_equal_autodiff_for_features_and_prototypes(ratio, epsilon):
    rng = np.random.default_rng(3)
    x = tf.constant(rng.normal(0.3, 0.5, size=(2, 3, 3, 4)))
    prototypes = rng.normal(0.3, 0.5, size=(5, 4))
    closed = _layer_gradients("implicit", x, prototypes, ratio, epsilon, 500)
    auto = _layer_gradients("unrolled", x, prototypes, ratio, epsilon, 500)
    for c, a in zip(closed, auto):
        assert np.abs(a).max() > 1e-3
        np.testing.assert_allclose(c, a, atol=1e-6, rtol=0)


def test_implicit_gradients_equal_finite_differences():
    rng = np.random.default_rng(4)
    x = tf.constant(rng.normal(0.3, 0.5, size=(1, 2, 3, 3)))
    prototypes = tf.constant(rng.normal(0.3, 0.5, size=(3, 3)))
    weights = tf.constant(rng.normal(size=(1, 3)))
    layer = GeneralizedSumPooling(num_prototypes=3, max_iter=300, threshold=0, return_attributes=True,
                                  dtype="float64")
    layer.build(x.shape)

    @tf.function
    def value(x, prototypes):
        layer.prototypes.assign(prototypes)
        pooled, z = layer(x)
        return tf.reduce_sum(pooled * weights) + tf.reduce_sum(tf.square(z))

    theoretical, numerical = tf.test.compute_gradient(lambda a: value(a, prototypes), [x], delta=1e-6)
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-6)
    layer.prototypes.assign(prototypes)
    with tf.GradientTape() as tape:
        pooled, z = layer(x)
        out = tf.reduce_sum(pooled * weights) + tf.reduce_sum(tf.square(z))
    analytic = tape.gradient(out, layer.prototypes).numpy()
    numeric = np.zeros_like(analytic)
    base = prototypes.numpy()
    for idx in np.ndindex(base.shape):
        step = np.zeros_like(base)
        step[idx] = 1e-6
        numeric[idx] = (value(x, tf.constant(base + step)) - value(x, tf.constant(base - step))).numpy() / 2e-6
    np.testing.assert_allclose(analytic, numeric, atol=1e-6)


@pytest.mark.parametrize("kwargs,name", [({"num_prototypes": 0}, "num_prototypes"),
                                         ({"transport_ratio": 0.0}, "transport_ratio"),
                                         ({"epsilon": 0.0}, "epsilon"),
                                         ({"max_iter": -2}, "max_iter"),
                                         ({"threshold": -1.0}, "threshold"),
                                         ({"gradient": "autodiff"}, "gradient")])
def test_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        GeneralizedSumPooling(**kwargs)
    with pytest.raises(ValueError, match="inputs"):
        GeneralizedSumPooling()(tf.zeros([2, 3]))


# ---- Keras checks ------------------------------------------------------------------------------------------

X = _features(5, (16, 6, 6, 3))
Y = (np.arange(16) % 3).astype(np.int32)
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _build_model(return_attributes=False):
    inputs = keras.Input((6, 6, 3))
    features = keras.layers.Conv2D(8, 1, name="conv")(inputs)
    pooled = GeneralizedSumPooling(num_prototypes=4, max_iter=20, return_attributes=return_attributes,
                                   name="gsp")(features)
    if return_attributes:
        pooled, z = pooled
        return keras.Model(inputs, [keras.layers.Dense(3, name="head")(pooled), z])
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(pooled))


def test_save_load_roundtrip(tmp_path):
    model = _build_model(return_attributes=True)
    restored = keras_checks.assert_save_load_roundtrip(model, X, tmp_path)
    gsp = restored.get_layer("gsp")
    assert gsp.get_config() == model.get_layer("gsp").get_config()


def test_fits_with_xla():
    keras_checks.assert_fits_with_xla(_build_model, X, Y, LOSS)


def test_fits_mirrored():
    keras_checks.assert_fits_mirrored(_build_model, X, Y, LOSS)


def test_mixed_precision():
    reference = _build_model()
    keras_checks.assert_mixed_precision(_build_model, X, float32_model=reference)


def test_export_parity(tmp_path):  # both outputs: the pooled vector (through a head) and the pseudo-attributes
    keras_checks.assert_export_parity(_build_model(return_attributes=True), X[:4], tmp_path)
