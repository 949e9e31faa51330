"""Numerical safety and vocabulary of emd / EMDHead / StructuredFC.

The dtype policy (float32 under float32 and mixed_float16, float64 only for float64 inputs), zero feature vectors,
epsilon = 1e-3 in float32, NaN input (confined with the entropic method, a clear error with the exact one), zero-mass
weights with the entropic method, and feature maps of unknown spatial size.
"""
import keras
import numpy as np
import ot
import pytest
import tensorflow as tf

from ot_layers import EMDHead, StructuredFC
from ot_layers.layers.emd_head import EXPORT_PARITY_RTOL
from ot_layers.solvers import emd, sinkhorn

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")


def _features(rng, *shape):
    return np.maximum(rng.standard_normal(shape), 0).astype(np.float32) + 0.01 * rng.random(shape).astype(np.float32)


def _reference_logits(query, support, scale=12.5):
    """NumPy + ot.emd2 restatement of Zhang et al. 2022 Eq. 1-2, 11-12 (channel-centred cosine cost; a zero node has
    cosine 0 with everything, i.e. cost 1)."""
    q = query.reshape(query.shape[0], -1, query.shape[-1]).astype(np.float64)
    s = support.reshape(support.shape[0], -1, support.shape[-1]).astype(np.float64)
    unit = lambda v: v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)  # noqa: E731
    logits = np.zeros((len(q), len(s)))
    for i, u in enumerate(q):
        for k, v in enumerate(s):
            cost = np.maximum(1 - unit(u - u.mean(1, keepdims=True)) @ unit(v - v.mean(1, keepdims=True)).T, 0)
            a = np.maximum(u @ v.mean(0), 0) + 1e-3
            b = np.maximum(v @ u.mean(0), 0) + 1e-3
            logits[i, k] = scale * (1 - ot.emd2(a / a.sum(), b / b.sum(), cost))
    return logits


def _graph_dtypes(fn, *specs):
    """Every dtype named in the traced graph of ``fn`` (its nested loop and gradient functions included)."""
    text = str(tf.function(fn).get_concrete_function(*specs).graph.as_graph_def())
    return {dtype for dtype in ("DT_DOUBLE", "DT_FLOAT", "DT_HALF") if dtype in text}


# --- dtype policy ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_sinkhorn_head_computes_in_float32_without_float64(policy):
    head = EMDHead(method="sinkhorn", dtype=policy)
    spec = tf.TensorSpec((None, 4, 6), tf.float32)

    def logits_and_gradient(query, support):
        with tf.GradientTape() as tape:
            tape.watch([query, support])
            logits = head([query, support])
            loss = tf.reduce_sum(tf.cast(logits, tf.float32))
        return logits, tape.gradient(loss, [query, support])

    dtypes = _graph_dtypes(logits_and_gradient, spec, spec)
    assert "DT_DOUBLE" not in dtypes and "DT_FLOAT" in dtypes
    rng = np.random.default_rng(0)
    query, support = _features(rng, 3, 4, 6), _features(rng, 2, 4, 6)
    logits = head([query, support])
    assert logits.dtype == (tf.float16 if policy == "mixed_float16" else tf.float32)
    # Against the same head computing in float64 (float64 policy): within a small fraction of the logits' scale.
    reference = EMDHead(method="sinkhorn", dtype="float64")([query.astype(np.float64), support.astype(np.float64)])
    assert reference.dtype == tf.float64
    relative = np.max(np.abs(logits.numpy().astype(np.float64) - reference.numpy())) / np.max(np.abs(reference))
    assert relative < (2e-3 if policy == "mixed_float16" else 1e-5), relative


@pytest.mark.parametrize("policy, dtype", [("float32", tf.float32), ("mixed_float16", tf.float16),
                                           ("float64", tf.float64)])
def test_exact_head_returns_the_compute_dtype(policy, dtype):
    rng = np.random.default_rng(1)
    query, support = _features(rng, 3, 2, 2, 6), _features(rng, 2, 2, 2, 6)
    logits = EMDHead(method="exact", dtype=policy)([query, support])
    assert logits.dtype == dtype
    atol = {"float32": 5e-5, "mixed_float16": 0.05, "float64": 1e-10}[policy]
    np.testing.assert_allclose(logits.numpy().astype(np.float64), _reference_logits(query, support), atol=atol)


# --- zero vectors and a small epsilon ----------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["exact", "sinkhorn"])
def test_zero_feature_vectors_give_finite_logits_and_gradients(method):
    rng = np.random.default_rng(2)
    query, support = _features(rng, 3, 4, 6), _features(rng, 2, 4, 6)
    query[0] = 0.0        # an all-zero query
    query[1, 2] = 0.0     # one zero node
    support[1, 0] = 0.0
    q, s = tf.constant(query), tf.constant(support)
    with tf.GradientTape() as tape:
        tape.watch([q, s])
        logits = EMDHead(method=method)([q, s])
        loss = LOSS(np.array([0, 1, 0]), logits)
    grads = tape.gradient(loss, [q, s])
    for tensor in (logits, *grads):
        assert np.all(np.isfinite(tensor.numpy()))
    tolerance = 5e-5 if method == "exact" else 0.03 * 12.5  # the entropic method: within ~2 % of the EMD
    np.testing.assert_allclose(logits.numpy(), _reference_logits(query, support), atol=tolerance)


@pytest.mark.parametrize("gradient_of", ["query", "support"])
def test_epsilon_1e_3_in_float32(gradient_of):
    rng = np.random.default_rng(3)
    query, support = _features(rng, 4, 5, 8), _features(rng, 3, 5, 8)
    q, s = tf.constant(query), tf.constant(support)
    # Sinkhorn needs ~1e4 updates at epsilon = 1e-3 to meet the threshold (a bound, the loop stops there).
    head = EMDHead(method="sinkhorn", epsilon=1e-3, max_iter=20_000, threshold=1e-4)
    with tf.GradientTape() as tape:
        tape.watch([q, s])
        logits = head([q, s])
        loss = LOSS(np.array([0, 1, 2, 0]), logits)
    grad = tape.gradient(loss, q if gradient_of == "query" else s)
    assert logits.dtype == tf.float32
    assert np.all(np.isfinite(logits.numpy())) and np.all(np.isfinite(grad.numpy()))
    # At epsilon = 1e-3 the entropic plan is close to the optimal flow: logits near the exact EMD's, and float32
    # agrees with the same head in float64 within 1e-4 of the logits' scale.
    np.testing.assert_allclose(logits.numpy(), _reference_logits(query, support), atol=0.01)
    in_float64 = EMDHead(method="sinkhorn", epsilon=1e-3, max_iter=20_000, threshold=1e-4, dtype="float64")(
        [query.astype(np.float64), support.astype(np.float64)]).numpy()
    assert np.max(np.abs(logits.numpy() - in_float64)) <= 1e-4 * np.max(np.abs(in_float64))


# --- NaN input ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad_value", [np.nan, np.inf])
def test_sinkhorn_head_confines_nan_to_its_query(bad_value):
    rng = np.random.default_rng(4)
    query, support = _features(rng, 4, 2, 2, 6), _features(rng, 3, 2, 2, 6)
    labels = np.array([0, 1, 2, 1])
    head = EMDHead(method="sinkhorn")
    healthy = [0, 2, 3]

    def run(q, y):
        q, s = tf.constant(q), tf.constant(support)
        with tf.GradientTape() as tape:
            tape.watch([q, s])
            logits = head([q, s])
            loss = LOSS(y, logits)
        return logits.numpy(), tape.gradient(loss, q).numpy()

    bad = query.copy()
    bad[1, 0, 1, 3] = bad_value
    logits, grad = run(bad, labels)
    clean_logits, clean_grad = run(query[healthy], labels[healthy])
    # Same iterations, same problems; float32 kernels may round differently for another batch size.
    np.testing.assert_allclose(logits[healthy], clean_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad[healthy], clean_grad, rtol=1e-4, atol=1e-5)
    assert np.all(np.isnan(logits[1]))


def test_exact_method_rejects_nan_with_a_clear_error():
    rng = np.random.default_rng(5)
    query, support = _features(rng, 3, 4, 6), _features(rng, 2, 4, 6)
    query[2, 1, 0] = np.nan
    with pytest.raises(ValueError, match="`cost`.*problem 4 .*NaN"):  # query 2 against class 0 is problem 4
        EMDHead(method="exact")([query, support])
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be finite"):
        tf.function(lambda q, s: EMDHead(method="exact")([q, s]))(query, support)
    cost = np.random.default_rng(6).random((2, 3, 3))
    with pytest.raises(ValueError, match="`a`"):
        emd(cost, np.array([0.5, np.nan, 0.5]), method="exact")


# --- zero-mass weights, unknown spatial size ---------------------------------------------------------------------

def test_entropic_emd_with_zero_weights_solves_the_reduced_problem():
    rng = np.random.default_rng(7)
    cost = rng.random((5, 4))
    a, b = np.array([0.3, 0.0, 0.2, 0.5, 0.0]), np.array([0.25, 0.25, 0.0, 0.5])
    c = tf.constant(cost)
    with tf.GradientTape() as tape:
        tape.watch(c)
        result = emd(c, a, b, method="sinkhorn", threshold=1e-10, max_iter=5000)
    grad = tape.gradient(result.cost, c).numpy()
    rows, cols = np.flatnonzero(a), np.flatnonzero(b)
    reduced = sinkhorn(cost[np.ix_(rows, cols)], a[rows], b[cols], epsilon=0.03, threshold=1e-10, max_iter=5000)
    np.testing.assert_allclose(result.plan.numpy()[np.ix_(rows, cols)], reduced.plan, atol=1e-12)
    assert np.all(result.plan.numpy()[a == 0] == 0) and np.all(result.plan.numpy()[:, b == 0] == 0)
    assert np.all(np.isfinite(grad)) and np.all(grad[a == 0] == 0) and np.all(grad[:, b == 0] == 0)
    np.testing.assert_allclose(result.cost, ot.sinkhorn2(a[rows], b[cols], cost[np.ix_(rows, cols)], 0.03,
                                                         method="sinkhorn_log", stopThr=1e-12), atol=1e-9)


@pytest.mark.parametrize("method", ["exact", "sinkhorn"])
def test_unknown_spatial_size(method):
    rng = np.random.default_rng(8)
    query_in, support_in = keras.Input((None, None, 6)), keras.Input((None, None, 6))
    head = EMDHead(method=method)
    model = keras.Model([query_in, support_in], head([query_in, support_in]))
    assert model.output_shape == (None, None)
    spec = tf.TensorSpec((None, None, None, 6), tf.float32)
    traced = tf.function(lambda q, s: model([q, s]), input_signature=[spec, spec])
    for q_shape, s_shape in (((3, 2, 3, 6), (2, 2, 2, 6)), ((2, 3, 3, 6), (4, 1, 3, 6))):
        query, support = _features(rng, *q_shape), _features(rng, *s_shape)
        flat = head([query.reshape(q_shape[0], -1, 6), support.reshape(s_shape[0], -1, 6)]).numpy()
        # float32 graph and eager runs round differently: the head's stated parity, relative to the logits' scale
        atol = EXPORT_PARITY_RTOL * np.max(np.abs(flat))
        np.testing.assert_allclose(traced(query, support), flat, atol=atol)
    inputs = keras.Input((None, None, 6))
    sfc = keras.Model(inputs, StructuredFC(2, 4, head={"method": method})(inputs))
    x = _features(rng, 3, 2, 2, 6)
    flat = sfc.layers[-1](x.reshape(3, 4, 6)).numpy()
    np.testing.assert_allclose(sfc.predict(x, verbose=0), flat, atol=EXPORT_PARITY_RTOL * np.max(np.abs(flat)))


# --- vocabulary --------------------------------------------------------------------------------------------------

def test_vocabulary_scale_initializer_and_read_only_export_blocker():
    rng = np.random.default_rng(9)
    query, support = _features(rng, 2, 3, 4), _features(rng, 2, 3, 4)
    doubled = EMDHead(scale=25.0, method="sinkhorn")([query, support])
    np.testing.assert_allclose(doubled, 2 * EMDHead(method="sinkhorn")([query, support]), rtol=1e-6)
    config = EMDHead(scale=3.0).get_config()
    assert config["scale"] == 3.0 and "temperature" not in config
    with pytest.raises(ValueError, match="temperature"):  # the 0.1 name is gone (docs/api.md)
        EMDHead(temperature=12.5)
    with pytest.raises(ValueError, match="scale"):
        EMDHead(scale=-1.0)
    layer = StructuredFC(2, 3, head={"scale": 5.0, "method": "sinkhorn"}, initializer="ones")
    layer.build((None, 3, 4))
    np.testing.assert_array_equal(layer.nodes.numpy(), 1.0)
    assert layer.get_config()["initializer"]["class_name"] == "Ones" and layer.head.scale == 5.0
    for instance, expected in ((EMDHead(method="sinkhorn"), None), (layer, None)):
        assert instance.export_blocker is expected
        with pytest.raises(AttributeError):
            instance.export_blocker = "no"
    assert 'method="sinkhorn"' in EMDHead(method="exact").export_blocker
