"""Numerical safety of sinkhorn, SinkhornMatch and MultiProxyWasserstein.

Zero-mass marginal entries (against POT and our own solver on the reduced problem, gradients against finite
differences), cost exponents p in {0.5, 1, 2}, all-zero feature vectors, epsilon = 1e-3 in float32, NaN/Inf input
confined to its own problem or sample, and feature maps of unknown spatial size.
"""
import re

import keras
import numpy as np
import ot
import pytest
import tensorflow as tf

from ot_layers import MultiProxyWasserstein, SinkhornMatch
from ot_layers.layers.sinkhorn_match import pairwise_cost, safe_power
from ot_layers.solvers import sinkhorn
from tests.gradient_checks import assert_directional_derivatives

EPSILON = 0.25
TIGHT = dict(epsilon=EPSILON, max_iter=5000, threshold=1e-13)
ZERO_ROWS = [[1], [0, 4]]  # zero-mass entries of a, per problem
ZERO_COLS = [[2], []]      # zero-mass entries of b, per problem


def _zero_mass_problem(seed=0, n=6, m=5):
    rng = np.random.default_rng(seed)
    cost = rng.uniform(0.0, 2.0, (2, n, m))
    a, b = rng.uniform(0.2, 1.0, (2, n)), rng.uniform(0.2, 1.0, (2, m))
    for p in range(2):
        a[p, ZERO_ROWS[p]] = 0.0
        b[p, ZERO_COLS[p]] = 0.0
    return cost, a / a.sum(-1, keepdims=True), b / b.sum(-1, keepdims=True), rng


def _reduce(p, cost, a, b):
    rows = np.setdiff1d(np.arange(a.shape[-1]), ZERO_ROWS[p])
    cols = np.setdiff1d(np.arange(b.shape[-1]), ZERO_COLS[p])
    return rows, cols, cost[p][np.ix_(rows, cols)], a[p, rows], b[p, cols]


def _loss(result, weights):
    return (tf.reduce_sum(result.plan * weights) + 0.7 * tf.reduce_sum(result.value)
            + 0.3 * tf.reduce_sum(result.transport_cost))


def _solve_with_gradients(cost, a, b, weights, **kwargs):
    cost, a, b = (tf.constant(t) for t in (cost, a, b))
    with tf.GradientTape() as tape:
        tape.watch([cost, a, b])
        result = sinkhorn(cost, a, b, **kwargs)
        loss = _loss(result, weights)
    return result, loss, [g.numpy() for g in tape.gradient(loss, [cost, a, b])]


def _centred(x):
    return x - x.mean(-1, keepdims=True)


@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
@pytest.mark.parametrize("domain", ["log", "kernel"])
def test_zero_mass_entries_solve_the_reduced_problem(gradient, domain):
    cost, a, b, rng = _zero_mass_problem()
    weights = rng.normal(size=cost.shape)
    result, _, (d_cost, d_a, d_b) = _solve_with_gradients(cost, a, b, weights, gradient=gradient, domain=domain,
                                                          **TIGHT)
    plan = result.plan.numpy()
    for tensor in (*result[:5], result.error):
        assert np.all(np.isfinite(tensor.numpy()))
    for grad in (d_cost, d_a, d_b):
        assert np.all(np.isfinite(grad))
    for p in range(2):
        assert np.all(plan[p, ZERO_ROWS[p], :] == 0.0) and np.all(plan[p, :, ZERO_COLS[p]] == 0.0)
        assert np.all(d_a[p, ZERO_ROWS[p]] == 0.0) and np.all(d_b[p, ZERO_COLS[p]] == 0.0)
        rows, cols, r_cost, r_a, r_b = _reduce(p, cost, a, b)
        # POT on the problem with the zero-mass rows and columns removed.
        pot_plan = ot.sinkhorn(r_a, r_b, r_cost, EPSILON, method="sinkhorn_log", numItermax=100_000, stopThr=1e-13)
        np.testing.assert_allclose(plan[p][np.ix_(rows, cols)], pot_plan, atol=1e-10)
        pot_cost = ot.sinkhorn2(r_a, r_b, r_cost, EPSILON, method="sinkhorn_log", numItermax=100_000, stopThr=1e-13)
        np.testing.assert_allclose(result.transport_cost[p], pot_cost, atol=1e-10)
        # Our own solver on the reduced problem: value, potentials and every gradient.
        reduced, _, (r_d_cost, r_d_a, r_d_b) = _solve_with_gradients(
            r_cost, r_a, r_b, weights[p][np.ix_(rows, cols)], gradient=gradient, domain=domain, **TIGHT)
        np.testing.assert_allclose(result.value[p], reduced.value, atol=1e-12)
        potentials = result.f.numpy()[p, rows][:, None] + result.g.numpy()[p, cols][None, :]  # gauge-free
        np.testing.assert_allclose(potentials, reduced.f.numpy()[:, None] + reduced.g.numpy()[None, :], atol=1e-9)
        expected_d_cost = np.zeros_like(cost[p])
        expected_d_cost[np.ix_(rows, cols)] = r_d_cost
        np.testing.assert_allclose(d_cost[p], expected_d_cost, atol=1e-9)
        # Only mass-preserving changes of the marginals are defined: compare centred gradients on the support.
        np.testing.assert_allclose(_centred(d_a[p, rows]), _centred(r_d_a), atol=1e-9)
        np.testing.assert_allclose(_centred(d_b[p, cols]), _centred(r_d_b), atol=1e-9)


@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
def test_zero_mass_gradients_match_finite_differences(gradient):
    cost, a, b, rng = _zero_mass_problem(seed=1)
    weights = rng.normal(size=cost.shape)
    _, _, (d_cost, d_a, d_b) = _solve_with_gradients(cost, a, b, weights, gradient=gradient, **TIGHT)

    def loss(c, aa, bb):
        return float(_loss(sinkhorn(c, aa, bb, gradient=gradient, **TIGHT), weights))

    h = 1e-6
    for _ in range(3):
        direction = rng.normal(size=cost.shape)  # zero-mass rows included: their gradient must be 0
        numeric = (loss(cost + h * direction, a, b) - loss(cost - h * direction, a, b)) / (2 * h)
        np.testing.assert_allclose(np.sum(d_cost * direction), numeric, rtol=1e-5, atol=1e-8)
        # Mass-preserving directions on the support of a and b (a zero entry cannot move down).
        da, db = rng.normal(size=a.shape) * (a > 0), rng.normal(size=b.shape) * (b > 0)
        da -= (a > 0) * da.sum(-1, keepdims=True) / (a > 0).sum(-1, keepdims=True)
        db -= (b > 0) * db.sum(-1, keepdims=True) / (b > 0).sum(-1, keepdims=True)
        numeric = (loss(cost, a + h * da, b + h * db) - loss(cost, a - h * da, b - h * db)) / (2 * h)
        np.testing.assert_allclose(np.sum(d_a * da) + np.sum(d_b * db), numeric, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
def test_problem_without_mass_is_zero_and_leaves_the_batch_alone(gradient):
    cost, a, b, _ = _zero_mass_problem(seed=2)
    a[1], b[1] = 0.0, 0.0
    weights = np.ones_like(cost)
    result, _, grads = _solve_with_gradients(cost, a, b, weights, gradient=gradient, **TIGHT)
    alone, _, alone_grads = _solve_with_gradients(cost[:1], a[:1], b[:1], weights[:1], gradient=gradient, **TIGHT)
    assert np.all(result.plan.numpy()[1] == 0) and float(result.value[1]) == 0.0
    assert float(result.transport_cost[1]) == 0.0 and float(result.error[1]) == 0.0
    np.testing.assert_array_equal(result.f[1], 0.0)
    np.testing.assert_allclose(result.plan[0], alone.plan[0], atol=1e-14)
    for grad, expected in zip(grads, alone_grads):
        assert np.all(np.isfinite(grad)) and np.all(grad[1] == 0)
        np.testing.assert_allclose(grad[0], expected[0], atol=1e-12)


# --- NaN / Inf input ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
@pytest.mark.parametrize("domain", ["auto", "log", "kernel"])
@pytest.mark.parametrize("bad_value", [np.nan, -np.inf])  # (+inf is a valid cost: a forbidden pair)
def test_nan_cost_stays_in_its_problem(gradient, domain, bad_value):
    rng = np.random.default_rng(3)
    cost = rng.uniform(0.0, 2.0, (4, 5, 6)).astype(np.float32)
    weights = rng.normal(size=cost.shape).astype(np.float32)
    bad = cost.copy()
    bad[2, 1, 3] = bad_value
    healthy = [0, 1, 3]

    def run(c, w):
        c = tf.constant(c)
        with tf.GradientTape() as tape:
            tape.watch(c)
            result = sinkhorn(c, epsilon=0.1, max_iter=200, threshold=1e-4, gradient=gradient, domain=domain)
            loss = tf.reduce_sum(result.plan * w) + tf.reduce_sum(result.value)
        return result, tape.gradient(loss, c).numpy()

    result, grad = run(bad, weights)
    clean, clean_grad = run(cost[healthy], weights[healthy])
    # The stopping test ignores the bad problem: the others run exactly as without it and meet the threshold.
    np.testing.assert_array_equal(result.iterations.numpy()[healthy], clean.iterations.numpy())
    assert np.all(clean.iterations.numpy() > 1) and not bool(result.converged[2])
    assert np.all(result.error.numpy()[healthy] <= 1e-4)
    for name in ("plan", "value", "f", "g", "transport_cost"):
        np.testing.assert_allclose(getattr(result, name).numpy()[healthy], getattr(clean, name).numpy(),
                                   atol=1e-6, err_msg=name)
    np.testing.assert_allclose(grad[healthy], clean_grad, atol=1e-5)
    assert not np.all(np.isfinite(result.plan.numpy()[2]))


@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
@pytest.mark.parametrize("domain", ["log", "kernel"])
def test_forbidden_pairs_cost_nothing(gradient, domain):
    # +inf marks a forbidden pair: its plan entry is exactly 0, and it adds 0 (not 0 * inf = NaN) to the transport
    # cost. A finite cost large enough for exp(-C / eps) to be exactly 0 is the same problem: every output and
    # gradient must equal that problem's, and the plan must equal POT's.
    cost, a, b, rng = _zero_mass_problem(seed=4)
    a, b = np.abs(a) + 0.1, np.abs(b) + 0.1
    a, b = a / a.sum(-1, keepdims=True), b / b.sum(-1, keepdims=True)
    forbidden = np.zeros(cost.shape, bool)
    forbidden[0, 0, 1] = forbidden[0, 3, 4] = forbidden[1, 2, 0] = True
    infinite, large = np.where(forbidden, np.inf, cost), np.where(forbidden, 1e4, cost)
    weights = rng.normal(size=cost.shape)
    result, loss, grads = _solve_with_gradients(infinite, a, b, weights, gradient=gradient, domain=domain, **TIGHT)
    same, same_loss, same_grads = _solve_with_gradients(large, a, b, weights, gradient=gradient, domain=domain,
                                                        **TIGHT)
    assert np.all(result.plan.numpy()[forbidden] == 0.0)
    for name in ("plan", "value", "transport_cost", "error"):
        np.testing.assert_allclose(getattr(result, name), getattr(same, name), atol=1e-12, err_msg=name)
    np.testing.assert_allclose(float(loss), float(same_loss), atol=1e-12)
    for grad, expected in zip(grads, same_grads):
        assert np.all(np.isfinite(grad))
        np.testing.assert_allclose(grad, expected, atol=1e-9)
    assert np.all(grads[0][forbidden] == 0.0)
    for p in range(2):
        pot_plan = ot.sinkhorn(a[p], b[p], infinite[p], EPSILON, method="sinkhorn_log", numItermax=100_000,
                               stopThr=1e-13)
        np.testing.assert_allclose(result.plan[p], pot_plan, atol=1e-10)
        np.testing.assert_allclose(result.transport_cost[p], np.sum(pot_plan * large[p]), atol=1e-10)


# --- cost exponent p ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.5, 1.0, 2.0])
def test_safe_power_value_and_gradient(p):
    base = tf.constant([0.0, 1e-3, 0.3, 1.0, 1.7], tf.float64)
    with tf.GradientTape() as tape:
        tape.watch(base)
        value = safe_power(base, p)
    grad = tape.gradient(value, base).numpy()
    np.testing.assert_allclose(value.numpy(), base.numpy() ** p, rtol=1e-15, atol=0)  # pow may differ by an ulp
    assert np.all(np.isfinite(grad))
    assert grad[0] == (1.0 if p == 1.0 else 0.0)  # a subgradient at the minimum of base^p (the one-sided slope for p=1)
    h = 1e-7
    numeric = ((base.numpy()[1:] + h) ** p - (base.numpy()[1:] - h) ** p) / (2 * h)  # away from 0
    np.testing.assert_allclose(grad[1:], numeric, rtol=1e-6)


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("cost", ["cosine", "sqeuclidean"])
def test_match_gradient_with_cost_exponent(p, cost):
    """Autodiff against finite differences (float64, away from a zero cost) and finite at a zero cost."""
    rng = np.random.default_rng(4)
    targets = rng.normal(size=(2, 3, 4))
    layer = SinkhornMatch(cost=cost, p=p, epsilon=0.5, threshold=0.0, max_iter=60, gradient="unrolled",
                          return_cost=True, dtype="float64")
    weights = rng.normal(size=(3, 2))

    def loss(x):
        return tf.reduce_sum(layer([x, targets])[1] * weights)

    x = tf.constant(rng.normal(size=(3, 5, 4)))
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = loss(x)
    grad = tape.gradient(value, x).numpy()
    assert_directional_derivatives(loss, x.numpy(), grad, rng, count=3, rtol=1e-5, atol=1e-9)

    # A feature equal to a target (cosine: a multiple of its direction) has a zero cost to it.
    at_zero = x.numpy().copy()
    at_zero[0, 0] = targets[1, 2] * (3.0 if cost == "cosine" else 1.0)
    base, _ = pairwise_cost(tf.constant(at_zero), tf.constant(targets), cost, p)
    assert float(base[0, 1, 0, 2]) <= 1e-12
    for gradient in ("implicit", "unrolled"):
        for dtype in ("float32", "float64"):
            x0 = tf.constant(at_zero, dtype)
            t0 = tf.constant(targets, dtype)
            match = SinkhornMatch(cost=cost, p=p, gradient=gradient, return_cost=True, dtype=dtype)
            with tf.GradientTape() as tape:
                tape.watch([x0, t0])
                plans, costs = match([x0, t0])
                total = tf.reduce_sum(costs) + tf.reduce_sum(plans * rng.normal(size=plans.shape))
            for g in tape.gradient(total, [x0, t0]):
                assert np.all(np.isfinite(g.numpy())), (gradient, dtype)


# --- zero vectors, small epsilon ---------------------------------------------------------------------------------

def _cosine_reference_logits(features, proxies, epsilon):
    """POT plans of the cosine cost (a zero vector has cosine 0: cost 1) weighted by the raw inner products: the
    entropic plan (``ot.sinkhorn``) or, for ``epsilon=None``, the exact one (``ot.emd``)."""
    norm = lambda v: v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)  # noqa: E731
    cost = 1.0 - np.einsum("bnd,kmd->bknm", norm(features), norm(proxies))
    inner = np.einsum("bnd,kmd->bknm", features, proxies)
    n, m = cost.shape[-2:]
    a, b = np.full(n, 1 / n), np.full(m, 1 / m)
    logits = np.zeros(cost.shape[:2])
    for i in range(cost.shape[0]):
        for k in range(cost.shape[1]):
            if epsilon is None:
                plan = ot.emd(a, b, cost[i, k])
            else:
                plan = ot.sinkhorn(a, b, cost[i, k], epsilon, method="sinkhorn_log", numItermax=50_000, stopThr=1e-11)
            logits[i, k] = np.sum(plan * inner[i, k])
    return logits


@pytest.mark.parametrize("epsilon", [0.1, 1e-3])
@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
def test_mpw_zero_vectors_and_small_epsilon_in_float32(epsilon, gradient):
    rng = np.random.default_rng(5)
    features = rng.normal(size=(3, 2, 2, 4)).astype(np.float32)
    features[0] = 0.0           # an all-zero feature map
    features[1, 0, 1] = 0.0     # one zero element
    # Near-permutation plans can need ~2e4 updates at epsilon = 0.1 (POT too): a bound, not a fixed count.
    settings = dict(threshold=1e-6, max_iter=30_000) if epsilon == 0.1 else dict(threshold=1e-4, max_iter=1000)
    layer = MultiProxyWasserstein(2, num_proxies=2, epsilon=epsilon, gradient=gradient,
                                  initializer=keras.initializers.RandomNormal(seed=0), **settings)
    x = tf.constant(features)
    with tf.GradientTape() as tape:
        tape.watch(x)
        logits = layer(x)
        loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(np.array([0, 1, 1]), logits,
                                                                          from_logits=True))
    d_x, d_proxies = tape.gradient(loss, [x, layer.proxies])
    assert logits.dtype == tf.float32
    for tensor in (logits, d_x, d_proxies):
        assert np.all(np.isfinite(tensor.numpy()))
    np.testing.assert_array_equal(logits.numpy()[0], 0.0)  # inner products with a zero map are 0
    flat, proxies = features.reshape(3, 4, 4).astype(np.float64), layer.proxies.numpy().astype(np.float64)
    if epsilon == 0.1:
        np.testing.assert_allclose(logits.numpy(), _cosine_reference_logits(flat, proxies, epsilon), atol=1e-5)
    else:  # POT's own Sinkhorn does not converge at 1e-3 in reasonable time; the plan is then near the exact one
        np.testing.assert_allclose(logits.numpy(), _cosine_reference_logits(flat, proxies, None), atol=3e-3)


# --- NaN input at the layers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
def test_mpw_nan_sample_is_confined(gradient):
    """Default threshold (0.1): a NaN sample must not stop or prolong the batch's Sinkhorn loop."""
    rng = np.random.default_rng(6)
    features = rng.normal(size=(4, 3, 3, 5)).astype(np.float32)
    labels = np.array([0, 2, 1, 1])
    layer = MultiProxyWasserstein(3, num_proxies=2, gradient=gradient)
    layer.build(features.shape)
    healthy = [0, 2, 3]

    def run(x, y):
        x = tf.constant(x)
        with tf.GradientTape() as tape:
            tape.watch(x)
            logits = layer(x)
            loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        return logits.numpy(), tape.gradient(loss, x).numpy()

    for bad_value in (np.nan, np.inf):
        bad = features.copy()
        bad[1, 1, 2, 0] = bad_value
        logits, grad = run(bad, labels)
        clean_logits, clean_grad = run(features[healthy], labels[healthy])
        np.testing.assert_allclose(logits[healthy], clean_logits, atol=1e-6)
        np.testing.assert_allclose(grad[healthy], clean_grad, atol=1e-6)
        assert np.all(np.isnan(logits[1]))


# --- unknown spatial size ----------------------------------------------------------------------------------------

def test_unknown_spatial_size():
    rng = np.random.default_rng(7)
    sets = rng.normal(size=(3, 2, 8)).astype(np.float32)
    inputs = keras.Input((None, None, 8))
    mpw = MultiProxyWasserstein(3, num_proxies=2, name="mpw")
    match = SinkhornMatch(return_cost=True, name="match")
    _, costs = match([inputs, sets])
    model = keras.Model(inputs, [mpw(inputs), costs])
    assert model.output_shape == [(None, 3), (None, 3)]
    for shape in ((2, 3, 4, 8), (3, 2, 2, 8)):
        x = rng.normal(size=shape).astype(np.float32)
        logits, match_costs = model.predict(x, verbose=0)
        flat = x.reshape(shape[0], -1, 8)  # the same layers on a known-size set
        np.testing.assert_allclose(logits, mpw(flat), atol=1e-6)
        np.testing.assert_allclose(match_costs, match([flat, sets])[1], atol=1e-6)
    spec = tf.TensorSpec((None, None, None, 8), tf.float32)
    traced = tf.function(lambda x: mpw(x), input_signature=[spec])
    x = rng.normal(size=(2, 2, 3, 8)).astype(np.float32)
    np.testing.assert_allclose(traced(x), mpw(x), atol=1e-6)


# --- vocabulary --------------------------------------------------------------------------------------------------

def test_vocabulary_and_read_only_export_blocker():
    layer = MultiProxyWasserstein(3, num_proxies=2, epsilon=0.1, initializer="zeros")
    config = layer.get_config()
    assert config["initializer"]["class_name"] == "Zeros" and "proxy_initializer" not in config
    assert {"num_proxies", "epsilon", "max_iter", "threshold", "gradient", "p"} <= set(config)
    with pytest.raises(ValueError, match="proxy_initializer"):  # the 0.1 name is gone (docs/api.md)
        MultiProxyWasserstein(3, proxy_initializer="zeros")
    for instance in (layer, SinkhornMatch()):
        assert instance.export_blocker is None
        with pytest.raises(AttributeError):
            instance.export_blocker = "no"
    layer.build((None, 2, 2, 5))
    assert [w.path.split("/")[-1] for w in layer.weights] == ["proxies"]


def test_shapes_that_cannot_pair_are_refused_naming_the_argument():
    """A marginal whose batch does not broadcast to the cost's, an empty side and a per-sample pairing of unequal
    batches failed inside the backend (an AddV2, StridedSlice or einsum error naming no argument)."""
    rng = np.random.default_rng(0)
    cost = rng.random((2, 3, 4)).astype(np.float32)
    with pytest.raises(ValueError, match=re.escape("`a` has batch shape (3,), which does not broadcast to the "
                                                   "batch shape (2,) of `cost`")):
        sinkhorn(cost, a=np.ones((3, 3)) / 3)
    with pytest.raises(ValueError, match="`cost` must have n >= 1 rows and m >= 1 columns"):
        sinkhorn(cost[:, :0])
    with pytest.raises(ValueError, match=re.escape("`pairing='sample'` matches each sample with its own targets: "
                                                   "`features` holds 2 samples but `targets` 3")):
        SinkhornMatch(pairing="sample")([rng.random((2, 5, 4)), rng.random((3, 6, 4))])
    # what broadcasts still runs: one marginal for every problem, or one per problem
    for a in (np.ones((1, 3)) / 3, np.ones((2, 3)) / 3, np.ones(3) / 3):
        assert tuple(sinkhorn(cost, a=a).plan.shape) == (2, 3, 4)
