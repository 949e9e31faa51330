"""ot_layers.solvers.emd against POT's exact EMD, finite differences, and the entropic deviation bound."""
import importlib
import warnings

import numpy as np
import ot
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from ot_layers.solvers import emd, sinkhorn

# The module (``ot_layers.solvers.emd`` as an attribute is the function the package re-exports).
emd_module = importlib.import_module("ot_layers.solvers.emd")


def _problem(rng, batch, n, m, dtype=np.float64):
    cost = rng.random((batch, n, m))
    a = rng.random((batch, n)) + 0.05
    b = rng.random((batch, m)) + 0.05
    return cost.astype(dtype), (a / a.sum(1, keepdims=True)).astype(dtype), (b / b.sum(1, keepdims=True)).astype(dtype)


def _marginal_miss(plan, a, b):
    """The larger of the row and column L1 marginal misses of ``plan`` ``(P, n, m)`` (NumPy)."""
    return np.maximum(np.abs(plan.sum(-1) - a).sum(-1), np.abs(plan.sum(-2) - b).sum(-1))


def _cosine_costs(rng, batch, n, d=64):
    u = rng.standard_normal((batch, n, d))
    v = rng.standard_normal((batch, n, d))
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    return (1.0 - np.einsum("pnd,pmd->pnm", u, v)).astype(np.float32)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 9), m=st.integers(1, 9), batch=st.integers(1, 4))
def test_exact_matches_pot_emd2(seed, n, m, batch):
    cost, a, b = _problem(np.random.default_rng(seed), batch, n, m)
    result = emd(cost, a, b, method="exact")
    expected = np.array([ot.emd2(a[p], b[p], cost[p]) for p in range(batch)])
    np.testing.assert_allclose(result.cost.numpy(), expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(result.plan.numpy().sum(-1), a, atol=1e-9)
    np.testing.assert_allclose(result.plan.numpy().sum(-2), b, atol=1e-9)
    np.testing.assert_allclose(np.sum(result.plan.numpy() * cost, axis=(-2, -1)), result.cost.numpy(), atol=1e-12)


def test_exact_result_reports_marginal_error_and_optimality():
    cost, a, b = _problem(np.random.default_rng(7), 4, 6, 5)
    result = emd(cost, a, b, method="exact")
    # The error is the larger relative L1 marginal error of the returned flow, recomputed here from the plan.
    expected = _marginal_miss(result.plan.numpy(), a, b) / a.sum(-1)
    np.testing.assert_allclose(result.error.numpy(), expected, atol=1e-15)
    assert np.all(result.error.numpy() < 1e-12)
    assert result.converged.dtype == tf.bool and np.all(result.converged.numpy())
    assert result.iterations.dtype == tf.int32
    np.testing.assert_array_equal(result.iterations.numpy(), np.full(4, emd_module.NOT_COUNTED))


def test_exact_result_flags_a_simplex_stopped_at_its_iteration_bound(monkeypatch):
    rng = np.random.default_rng(8)
    cost, a, b = _problem(rng, 2, 30, 30)
    monkeypatch.setattr(emd_module, "SIMPLEX_MAX_ITER", 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = emd(cost, a, b, method="exact")
    # One warning per stopped problem, naming it (POT's own, index-less warning is not repeated).
    assert [(w.category, str(w.message).split(":")[0]) for w in caught] == [
        (RuntimeWarning, "Exact EMD, problem 0"), (RuntimeWarning, "Exact EMD, problem 1")]
    assert not np.any(result.converged.numpy())
    # The stopped simplex answers with a flow that still routes mass through its artificial arcs: the flow misses
    # the marginals (seen in ``error``), and its cost undercuts the optimum, which no feasible flow can.
    np.testing.assert_allclose(result.error.numpy(), _marginal_miss(result.plan.numpy(), a, b), atol=1e-15)
    assert np.all(result.error.numpy() > 1e-2)
    optimum = np.array([ot.emd2(a[p], b[p], cost[p]) for p in range(2)])
    assert np.all(result.cost.numpy() < optimum)


def test_sinkhorn_method_result_is_the_sinkhorn_solvers():
    cost = _cosine_costs(np.random.default_rng(9), 5, 7)
    result = emd(cost, method="sinkhorn", epsilon=0.05, max_iter=40, threshold=1e-4, domain="log")
    reference = sinkhorn(cost, epsilon=0.05, max_iter=40, threshold=1e-4, domain="log")
    for field in ("plan", "f", "g", "iterations", "error", "converged"):
        np.testing.assert_array_equal(getattr(result, field).numpy(), getattr(reference, field).numpy(), field)
    np.testing.assert_array_equal(result.cost.numpy(), reference.transport_cost.numpy())
    assert np.any(reference.iterations.numpy() > 1)


def test_exact_handles_batch_dims_broadcast_weights_and_float32():
    rng = np.random.default_rng(1)
    cost = rng.random((2, 3, 5, 4)).astype(np.float32)
    a = np.full(5, 0.2, np.float32)
    result = emd(cost, a, None, method="exact")
    assert result.plan.shape == (2, 3, 5, 4) and result.cost.dtype == tf.float32
    expected = np.array([[ot.emd2(a.astype(np.float64), np.full(4, 0.25), c.astype(np.float64)) for c in row]
                         for row in cost])
    np.testing.assert_allclose(result.cost.numpy(), expected, atol=1e-6)


def test_exact_duals_are_centred_and_dual_value_equals_primal():
    cost, a, b = _problem(np.random.default_rng(2), 3, 6, 7)
    result = emd(cost, a, b, method="exact")
    f, g = result.f.numpy(), result.g.numpy()
    np.testing.assert_allclose(f.mean(-1), 0, atol=1e-12)
    np.testing.assert_allclose(g.mean(-1), 0, atol=1e-12)
    # Strong duality up to the constant removed by centring: W = a.f + b.g + c, with f_i + g_j + c <= C_ij.
    shift = result.cost.numpy() - (a * f).sum(-1) - (b * g).sum(-1)
    assert np.all(f[:, :, None] + g[:, None, :] + shift[:, None, None] <= cost + 1e-9)


def test_exact_gradients_match_finite_differences():
    rng = np.random.default_rng(3)
    cost, a, b = _problem(rng, 2, 5, 6)  # continuous random data: a unique optimal flow and duals
    cost_t, a_t, b_t = (tf.constant(x) for x in (cost, a, b))
    weights = tf.constant(rng.standard_normal(2))
    with tf.GradientTape() as tape:
        tape.watch([cost_t, a_t, b_t])
        loss = tf.reduce_sum(weights * emd(cost_t, a_t, b_t, method="exact").cost)
    d_cost, d_a, d_b = (x.numpy() for x in tape.gradient(loss, [cost_t, a_t, b_t]))

    def value(c, aa, bb):
        return float(np.sum(weights.numpy() * emd(c, aa, bb, method="exact").cost.numpy()))

    h = 1e-6
    for _ in range(6):
        direction = rng.standard_normal(cost.shape)
        numeric = (value(cost + h * direction, a, b) - value(cost - h * direction, a, b)) / (2 * h)
        np.testing.assert_allclose(np.sum(d_cost * direction), numeric, rtol=1e-5, atol=1e-8)
    for _ in range(4):  # mass-preserving directions, the only ones defined for the weights
        da = rng.standard_normal(a.shape)
        da -= da.mean(-1, keepdims=True)
        db = rng.standard_normal(b.shape)
        db -= db.mean(-1, keepdims=True)
        numeric = (value(cost, a + h * da, b + h * db) - value(cost, a - h * da, b - h * db)) / (2 * h)
        np.testing.assert_allclose(np.sum(d_a * da) + np.sum(d_b * db), numeric, rtol=1e-5, atol=1e-8)


def test_exact_gradient_in_a_graph():
    cost, a, b = _problem(np.random.default_rng(4), 3, 4, 4, np.float32)

    @tf.function
    def grad(c):
        with tf.GradientTape() as tape:
            tape.watch(c)
            result = emd(c, a, b, method="exact")
            total = tf.reduce_sum(result.cost)
        return tape.gradient(total, c), result.plan

    d_cost, plan = grad(tf.constant(cost))
    assert d_cost.shape == (3, 4, 4)
    np.testing.assert_allclose(d_cost.numpy(), plan.numpy(), atol=1e-7)


def test_sinkhorn_method_within_two_percent_of_exact_on_cosine_costs():
    rng = np.random.default_rng(5)
    cost = _cosine_costs(rng, 100, 25)
    a = rng.random((100, 25)).astype(np.float32) + 0.1
    a /= a.sum(1, keepdims=True)
    exact = emd(cost, a, None, method="exact").cost.numpy()
    entropic = emd(cost, a, None, method="sinkhorn", domain="kernel").cost.numpy()
    deviation = np.max(np.abs(entropic - exact) / exact)
    assert deviation < 0.02, deviation
    assert np.all(entropic >= exact - 1e-5)  # a feasible plan never beats the optimum


def test_sinkhorn_method_uses_the_sinkhorn_solver_and_is_differentiable():
    cost = tf.constant(_cosine_costs(np.random.default_rng(6), 3, 5))
    with tf.GradientTape() as tape:
        tape.watch(cost)
        result = emd(cost, method="sinkhorn", epsilon=0.1)
        total = tf.reduce_sum(result.cost)
    grad = tape.gradient(total, cost)
    assert np.all(np.isfinite(grad.numpy()))
    np.testing.assert_allclose(result.plan.numpy().sum(-1), 0.2, atol=1e-3)


@pytest.mark.parametrize("kwargs, match", [
    (dict(method="qp"), "method"),
    (dict(method="sinkhorn", epsilon=0.0), "epsilon"),
    (dict(max_iter=0), "max_iter"),
    (dict(a=np.array([0.5, 0.5, 0.5]), b=np.full(3, 1 / 3)), "equal sums"),
    (dict(a=np.array([1.2, -0.2, 0.0]), b=np.full(3, 1 / 3)), "non-negative"),
    (dict(a=np.full(4, 0.25)), "`a` has 4 entries"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        emd(np.ones((3, 3)), **kwargs)


def test_cost_rank_is_checked():
    with pytest.raises(ValueError, match="cost"):
        emd(np.ones(3))


@pytest.mark.parametrize("method", ["exact", "sinkhorn"])
def test_a_cost_shared_by_a_batch_of_marginals_is_solved_for_each(method):
    """Marginals with more batch dimensions than the cost share it: each pair of marginals is its own problem
    (the exact solver used to solve the first pair only and return a scalar cost beside (2, n) potentials)."""
    rng = np.random.default_rng(4)
    cost = rng.random((3, 4))
    a = rng.random((2, 3))
    a /= a.sum(-1, keepdims=True)
    b = rng.random((5, 1, 4))
    b /= b.sum(-1, keepdims=True)
    settings = dict(epsilon=0.01, threshold=1e-9, max_iter=20_000) if method == "sinkhorn" else {}
    result = emd(cost, a, b, method=method, **settings)
    assert result.plan.shape == (5, 2, 3, 4) and result.cost.shape == (5, 2) and result.f.shape == (5, 2, 3)
    def reference(x, y):
        if method == "exact":
            return ot.emd2(x, y, cost)
        return np.sum(cost * ot.sinkhorn(x, y, cost, 0.01, method="sinkhorn_log", numItermax=100_000, stopThr=1e-12))

    expected = np.array([[reference(a[i], b[j, 0]) for i in range(2)] for j in range(5)])
    np.testing.assert_allclose(result.cost.numpy(), expected, atol=1e-8)


@pytest.mark.parametrize("method, domain", [("exact", "auto"), ("sinkhorn", "log"), ("sinkhorn", "kernel")])
def test_an_empty_batch_gives_empty_results(method, domain):
    """A batch of no problems (the last, empty slice of a dataset, say) failed in the marginal-sum check
    ("Cannot compute the max of an empty tensor") or, for the exact method, in the finiteness check."""
    result = emd(np.zeros((0, 3, 4), np.float32), method=method, domain=domain)
    assert result.plan.shape == (0, 3, 4) and result.cost.shape == (0,) and result.f.shape == (0, 3)
