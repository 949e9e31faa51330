"""GeneralizedSumPooling and ClassProxies on edge cases: zero vectors, epsilon 1e-3 in float32, mixed precision,
unknown spatial size, NaN input."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from ot_layers import ClassProxies, GeneralizedSumPooling


def _layer(dtype="float32", **kwargs):
    kwargs = {"num_prototypes": 4, "max_iter": 200, "threshold": 0, **kwargs}
    layer = GeneralizedSumPooling(dtype=dtype, **kwargs)
    layer.build((None, None, None, 3))
    prototypes = np.random.default_rng(1).uniform(0.0, 1.0, size=(4, 3))
    layer.prototypes.assign(prototypes.astype(layer.prototypes.dtype))
    return layer


def _features(seed=0, shape=(3, 3, 3, 3)):
    return np.random.default_rng(seed).uniform(0.0, 1.0, size=shape)


def _value_and_gradients(layer, x, weights):
    x = tf.constant(x, layer.variable_dtype)

    @tf.function
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            pooled, z = layer(x)
            value = tf.reduce_sum(tf.cast(pooled, x.dtype) * weights) + tf.reduce_sum(tf.square(tf.cast(z, x.dtype)))
        return pooled, z, value, tape.gradient(value, [x, layer.prototypes])

    return [np.asarray(t) if not isinstance(t, list) else [np.asarray(g) for g in t] for t in run(x)]


def test_all_zero_feature_vectors_give_finite_values_and_gradients_equal_to_finite_differences():
    x = _features(2, (2, 2, 3, 3))
    x[0, 0, 1] = 0.0  # one zero element
    x[1] = 0.0  # a whole zero feature map
    layer = _layer("float64", return_attributes=True)
    weights = tf.constant(np.random.default_rng(3).normal(size=(2, 3)))
    pooled, z, _, (grad_x, grad_prototypes) = _value_and_gradients(layer, x, weights)
    for array in (pooled, z, grad_x, grad_prototypes):
        assert np.all(np.isfinite(array))
    np.testing.assert_allclose(pooled[1], 0.0, atol=1e-15)

    @tf.function
    def value(x):
        pooled, z = layer(x)
        return tf.reduce_sum(pooled * weights) + tf.reduce_sum(tf.square(z))

    for idx in [(0, 0, 1, 0), (0, 0, 1, 2), (1, 1, 2, 1), (0, 1, 0, 0)]:  # at and away from the zero vectors
        step = np.zeros_like(x)
        step[idx] = 1e-6
        numeric = (float(value(tf.constant(x + step))) - float(value(tf.constant(x - step)))) / 2e-6
        np.testing.assert_allclose(grad_x[idx], numeric, atol=1e-7)


@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
def test_epsilon_1e_3_in_float32_follows_float64(gradient):
    x = _features(4)
    weights = np.random.default_rng(5).normal(size=(3, 3))
    results = {}
    for dtype in ("float32", "float64"):
        layer = _layer(dtype, epsilon=1e-3, gradient=gradient, return_attributes=True)
        results[dtype] = _value_and_gradients(layer, x, tf.constant(weights, dtype))
    (p32, z32, _, g32), (p64, z64, _, g64) = results["float32"], results["float64"]
    for array in (p32, z32, *g32):
        assert np.all(np.isfinite(array))
    np.testing.assert_allclose(p32, p64, atol=1e-4)
    np.testing.assert_allclose(z32, z64, atol=1e-4)
    for a, b in zip(g32, g64):
        np.testing.assert_allclose(a, b, atol=2e-3 * max(1.0, np.abs(b).max()))


def test_mixed_precision_computes_the_transport_in_float32():
    x = _features(6)
    reference = _layer("float32", return_attributes=True)
    expected = [np.asarray(o) for o in reference(tf.constant(x, tf.float16))]  # the same float16-rounded input
    layer = _layer("mixed_float16", return_attributes=True)
    pooled, z = layer(tf.constant(x, tf.float16))
    assert pooled.dtype == tf.float16 and layer.prototypes.dtype == "float32"
    # only the final cast to float16 differs from the float32 computation
    np.testing.assert_array_equal(np.asarray(pooled), expected[0].astype(np.float16))
    np.testing.assert_array_equal(np.asarray(z), expected[1].astype(np.float16))
    with tf.GradientTape() as tape:
        out = tf.reduce_sum(tf.cast(layer(tf.constant(x, tf.float16))[0], tf.float32))
    assert np.all(np.isfinite(np.asarray(tape.gradient(out, layer.prototypes))))


def test_unknown_spatial_size_in_a_functional_model():
    inputs = keras.Input((None, None, 3))
    layer = GeneralizedSumPooling(num_prototypes=4, name="gsp")
    model = keras.Model(inputs, layer(inputs))
    for shape in [(2, 3, 5, 3), (2, 4, 4, 3)]:
        x = _features(7, shape).astype(np.float32)
        flat = layer(tf.constant(x.reshape(shape[0], -1, 3)))  # the same elements as a set
        np.testing.assert_allclose(model.predict(x, verbose=0), flat, atol=1e-6)


@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
def test_nan_input_stays_in_its_sample(gradient):
    x = _features(8, (3, 3, 3, 3))
    bad = x.copy()
    bad[1, 0, 2, 1] = np.nan
    layer = _layer("float64", gradient=gradient, return_attributes=True, threshold=1e-6, max_iter=100)
    weights = np.random.default_rng(9).normal(size=(3, 3))
    p_bad, z_bad, _, (gx_bad, _) = _value_and_gradients(layer, bad, tf.constant(weights))
    p_ok, z_ok, _, (gx_ok, _) = _value_and_gradients(layer, x[[0, 2]], tf.constant(weights[[0, 2]]))
    for a, b in ((p_bad[[0, 2]], p_ok), (z_bad[[0, 2]], z_ok), (gx_bad[[0, 2]], gx_ok)):  # equal up to rounding
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-15)
    assert np.all(np.isnan(p_bad[1]))


def test_layers_export():
    assert GeneralizedSumPooling().export_blocker is None and ClassProxies(2).export_blocker is None


def test_class_proxies_with_zero_and_nan_embeddings():
    layer = ClassProxies(3, num_proxies=2)
    x = np.random.default_rng(10).normal(size=(4, 5)).astype(np.float32)
    x[1] = 0.0
    x[2, 3] = np.nan
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        s = layer(x)
        value = tf.reduce_sum(s[0]) + tf.reduce_sum(s[1]) + tf.reduce_sum(s[3])
    grad = tape.gradient(value, x).numpy()
    s = s.numpy()
    np.testing.assert_array_equal(s[1], 0.0)  # a zero embedding is orthogonal to every proxy
    assert np.all(np.isfinite(grad[[0, 1, 3]])) and np.all(np.isnan(s[2]))
    p = layer.proxies.numpy()
    p = p / np.linalg.norm(p, axis=-1, keepdims=True)
    expected = np.einsum("d,kmd->km", x[0].numpy() / np.linalg.norm(x[0].numpy()), p)
    np.testing.assert_allclose(s[0], expected, atol=1e-6)
