"""Partial transport solver (Prop. 5.2.1) and its implicit gradient (Prop. 5.2.2), including sharp selections."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from ot_layers.solvers import partial_transport
from ot_layers.solvers.partial_transport import GRADIENTS, METHODS


def _cost(seed, shape=(2, 4, 9)):
    return tf.constant(np.random.default_rng(seed).uniform(0.0, 2.0, size=shape))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), ratio=st.floats(0.05, 0.8), epsilon=st.floats(0.1, 2.0))
def test_constraints_hold_at_the_fixed_point(seed, ratio, epsilon):
    cost = _cost(seed)
    result = tf.function(partial_transport)(cost, ratio, epsilon=epsilon, max_iter=1000, threshold=0)
    n = cost.shape[-1]
    np.testing.assert_allclose(result.residual + tf.reduce_sum(result.plan, axis=1), 1.0 / n, atol=1e-10)
    np.testing.assert_allclose(tf.reduce_sum(result.plan, axis=[1, 2]), ratio, atol=1e-10)
    assert np.all(result.residual.numpy() >= 0) and np.all(result.plan.numpy() >= 0)


def _objective(cost, epsilon, rho, plan):
    entropy = np.sum(plan * np.log(plan)) + np.sum(rho * np.log(rho))
    return np.sum(cost * plan) + epsilon * entropy


def test_minimizes_problem_p2_like_a_generic_solver():
    cost = np.random.default_rng(3).uniform(0, 2, size=(3, 5))
    ratio, epsilon = 0.4, 0.5
    m, n = cost.shape
    result = partial_transport(tf.constant(cost), ratio, epsilon=epsilon, max_iter=500, threshold=0)
    ours = _objective(cost, epsilon, result.residual.numpy(), result.plan.numpy())

    def unpack(v):
        return v[:n], v[n:].reshape(m, n)

    constraints = [{"type": "eq", "fun": lambda v: unpack(v)[0] + unpack(v)[1].sum(0) - 1.0 / n},
                   {"type": "eq", "fun": lambda v: unpack(v)[1].sum() - ratio}]
    start = np.concatenate([np.full(n, (1 - ratio) / n), np.full(m * n, ratio / (m * n))])
    reference = minimize(lambda v: _objective(cost, epsilon, *unpack(v)), start, method="SLSQP",
                         constraints=constraints, bounds=[(1e-12, None)] * len(start),
                         options={"ftol": 1e-14, "maxiter": 1000})
    assert reference.success
    assert ours <= reference.fun + 1e-9
    np.testing.assert_allclose(result.plan.numpy(), unpack(reference.x)[1], atol=1e-5)


def test_unbatched_and_ratio_one_is_average_pooling_limit():
    cost = _cost(1, (4, 9))
    result = partial_transport(cost, 1.0, epsilon=0.2)
    assert result.residual.shape == (9,) and result.plan.shape == (4, 9) and int(result.iterations) == 0
    np.testing.assert_array_equal(result.residual.numpy(), 0.0)
    np.testing.assert_allclose(tf.reduce_sum(result.plan, axis=0), 1.0 / 9, atol=1e-15)
    # mu -> 1 from below approaches the same plan
    near = tf.function(partial_transport)(cost, 0.999, epsilon=0.2, max_iter=3000, threshold=0)
    np.testing.assert_allclose(near.plan.numpy(), result.plan.numpy(), rtol=1e-2, atol=1e-6)


def test_small_epsilon_does_not_underflow():
    cost = tf.constant(np.random.default_rng(0).uniform(5.0, 7.0, size=(1, 4, 9)), tf.float32)
    result = partial_transport(cost, 0.3, epsilon=0.01, max_iter=200)
    assert np.all(np.isfinite(result.plan.numpy()))
    np.testing.assert_allclose(tf.reduce_sum(result.plan), 0.3, rtol=1e-4)


def _loss(result, weights_plan, weights_residual):
    return tf.reduce_sum(result.plan * weights_plan) + tf.reduce_sum(tf.sin(result.residual * 9.0) * weights_residual)


def _gradient(cost, w_plan, w_res, mode, **kwargs):
    @tf.function
    def gradient(c):
        with tf.GradientTape() as tape:
            tape.watch(c)
            value = _loss(partial_transport(c, gradient=mode, **kwargs), w_plan, w_res)
        return tape.gradient(value, c)

    return gradient(cost).numpy()


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("ratio,epsilon", [(0.3, 0.2), (0.7, 2.0), (0.1, 0.1)])
def test_implicit_gradient_equals_autodiff_through_converged_solve(ratio, epsilon, method):
    cost = _cost(4)
    rng = np.random.default_rng(5)
    w_plan, w_res = tf.constant(rng.normal(size=(2, 4, 9))), tf.constant(rng.normal(size=(2, 9)))
    grads = {mode: _gradient(cost, w_plan, w_res, mode, transport_ratio=ratio, epsilon=epsilon, max_iter=400,
                             threshold=0, method=method) for mode in ("implicit", "unrolled")}
    assert np.abs(grads["unrolled"]).max() > 1e-3
    np.testing.assert_allclose(grads["implicit"], grads["unrolled"], atol=1e-6, rtol=0)


def _sharp_problem():
    """A selection sharp enough (mu = 0.3, epsilon = 0.01) that ``kappa = 1 / (1 - mu - n ||rho||^2)`` is ~ 740;
    Prop. 5.2.1 then needs ~ 6400 iterations to converge in float64."""
    cost = np.random.default_rng(23).uniform(0, 2, size=(2, 4, 10))[:1]
    rng = np.random.default_rng(0)
    return cost, rng.normal(size=(1, 4, 10)), rng.normal(size=(1, 10))


def _kappa(result, ratio):
    rho = result.residual.numpy()
    return 1.0 / (1.0 - ratio - rho.shape[-1] * np.sum(rho.astype(np.float64) ** 2, axis=-1))


def test_implicit_gradient_in_a_sharp_regime_equals_autodiff_through_a_converged_float64_solve():
    cost, w_plan, w_res = _sharp_problem()
    kwargs = dict(transport_ratio=0.3, epsilon=0.01, max_iter=9000, threshold=0)
    result = tf.function(partial_transport)(tf.constant(cost), **kwargs)
    assert float(tf.reduce_max(result.error)) < 1e-14
    assert _kappa(result, 0.3).max() > 500
    reference = _gradient(tf.constant(cost), tf.constant(w_plan), tf.constant(w_res), "unrolled", **kwargs)
    implicit = _gradient(tf.constant(cost), tf.constant(w_plan), tf.constant(w_res), "implicit", **kwargs)
    np.testing.assert_allclose(implicit, reference, atol=1e-12 * np.abs(reference).max(), rtol=0)
    # float32: as accurate as float32 allows, where 1 - mu - n ||rho||^2 ~ 1.4e-3 alone loses 3 of its 7 digits
    kwargs32 = kwargs
    implicit32 = _gradient(tf.constant(cost, tf.float32), tf.constant(w_plan, tf.float32),
                           tf.constant(w_res, tf.float32), "implicit", **kwargs32)
    np.testing.assert_allclose(implicit32, reference, atol=2e-5 * np.abs(reference).max(), rtol=0)


def test_implicit_gradient_equals_finite_differences_in_a_sharp_regime():
    cost, w_plan, w_res = _sharp_problem()
    kwargs = dict(transport_ratio=0.3, epsilon=0.01, max_iter=9000, threshold=1e-15)
    solve = tf.function(lambda c: _loss(partial_transport(c, **kwargs), w_plan, w_res))
    implicit = _gradient(tf.constant(cost), tf.constant(w_plan), tf.constant(w_res), "implicit", **kwargs)
    rng = np.random.default_rng(1)
    for idx in [tuple(rng.integers(0, s) for s in cost.shape) for _ in range(4)]:
        step = np.zeros_like(cost)
        step[idx] = 1e-6
        numeric = (float(solve(tf.constant(cost + step))) - float(solve(tf.constant(cost - step)))) / 2e-6
        np.testing.assert_allclose(implicit[idx], numeric, atol=1e-7 * np.abs(implicit).max())


def test_epsilon_1e_3_in_float32_gives_finite_values_and_gradients():
    cost64 = _cost(11, (2, 5, 12)).numpy()
    rng = np.random.default_rng(2)
    w_plan, w_res = rng.normal(size=(2, 5, 12)), rng.normal(size=(2, 12))
    out = {}
    for dtype in (tf.float32, tf.float64):
        c = tf.constant(cost64, dtype)
        result = partial_transport(c, 0.3, epsilon=1e-3, max_iter=100)
        grads = {mode: _gradient(c, tf.constant(w_plan, dtype), tf.constant(w_res, dtype), mode, transport_ratio=0.3,
                                 epsilon=1e-3, max_iter=100) for mode in GRADIENTS}
        out[dtype] = result, grads
        for g in grads.values():
            assert np.all(np.isfinite(g))
        assert np.all(np.isfinite(result.plan.numpy())) and np.all(np.isfinite(result.residual.numpy()))
        np.testing.assert_allclose(tf.reduce_sum(result.plan, axis=[1, 2]), 0.3, rtol=1e-5)
    (r32, g32), (r64, g64) = out[tf.float32], out[tf.float64]
    np.testing.assert_allclose(r32.plan.numpy(), r64.plan.numpy(), atol=1e-5)
    for mode in GRADIENTS:  # float32 follows the float64 computation of the same iterations
        np.testing.assert_allclose(g32[mode], g64[mode], atol=1e-3 * np.abs(g64[mode]).max())


def test_threshold_zero_runs_exactly_max_iter_of_prop_5_2_1():
    cost = _cost(12)
    n = cost.shape[-1]
    exact = partial_transport(cost, 0.3, epsilon=0.2, max_iter=7, threshold=0, method="fixed_point")
    np.testing.assert_array_equal(exact.iterations.numpy(), [7, 7])
    # Prop. 5.2.1 by hand, 7 iterations
    k = np.exp(-cost.numpy() / 0.2)
    s = k.sum(axis=1)
    s_scaled = s / s.max(axis=-1, keepdims=True)
    t = np.ones((cost.shape[0], 1))
    for _ in range(7):
        rho = (1.0 / n) / (1.0 + t * s_scaled)
        t = 0.3 / np.sum(s_scaled * rho, axis=-1, keepdims=True)
    np.testing.assert_allclose(exact.residual.numpy(), rho, rtol=1e-12)
    np.testing.assert_allclose(exact.plan.numpy(), t[:, :, None] * (k / s.max(axis=-1)[:, None, None]) * rho[:, None],
                               rtol=1e-12)
    np.testing.assert_array_equal(partial_transport(cost, 0.3, epsilon=0.2, max_iter=7, threshold=0).iterations, [7, 7])


@pytest.mark.parametrize("method", METHODS)
def test_threshold_stops_each_problem_early(method):
    cost = _cost(12)
    n = cost.shape[-1]
    early = partial_transport(cost, 0.3, epsilon=0.2, max_iter=1000, threshold=1e-4, method=method)
    assert early.iterations.shape == (2,) and early.iterations.dtype == tf.int32
    assert np.all(early.iterations.numpy() >= 1) and np.all(early.iterations.numpy() < 1000)
    assert float(tf.reduce_max(early.error)) <= 1e-4
    marginal = np.abs(early.residual.numpy() + early.plan.numpy().sum(1) - 1.0 / n).sum(-1)
    np.testing.assert_allclose(early.error.numpy(), marginal, atol=1e-12)
    for p in range(2):  # each problem stopped after its own count: that many iterations give its solution
        same = partial_transport(cost[p], 0.3, epsilon=0.2, max_iter=int(early.iterations[p]), threshold=0,
                                 method=method)
        assert int(same.iterations) == int(early.iterations[p])
        np.testing.assert_allclose(same.plan.numpy(), early.plan.numpy()[p], rtol=1e-13, atol=0)
        np.testing.assert_allclose(same.residual.numpy(), early.residual.numpy()[p], rtol=1e-13, atol=0)


def test_nan_stays_in_its_problem():
    cost = _cost(13, (3, 4, 9)).numpy()
    rng = np.random.default_rng(3)
    w_plan, w_res = rng.normal(size=cost.shape), rng.normal(size=(3, 9))
    bad = cost.copy()
    bad[1, 2, 3] = np.nan
    for mode in GRADIENTS:
        clean = _gradient(tf.constant(cost[[0, 2]]), tf.constant(w_plan[[0, 2]]), tf.constant(w_res[[0, 2]]), mode,
                          transport_ratio=0.3, epsilon=0.2, max_iter=100)
        mixed = _gradient(tf.constant(bad), tf.constant(w_plan), tf.constant(w_res), mode, transport_ratio=0.3,
                          epsilon=0.2, max_iter=100)
        # equal up to the last bit of float64 (batched kernels may round a batch of 3 and one of 2 differently)
        np.testing.assert_allclose(mixed[[0, 2]], clean, rtol=1e-14, atol=0)
        assert np.all(np.isnan(mixed[1]))
    result = partial_transport(tf.constant(bad), 0.3, epsilon=0.2)
    reference = partial_transport(tf.constant(cost[[0, 2]]), 0.3, epsilon=0.2)
    np.testing.assert_allclose(result.plan.numpy()[[0, 2]], reference.plan.numpy(), rtol=1e-14, atol=0)  # as above
    np.testing.assert_array_equal(result.iterations.numpy()[[0, 2]], reference.iterations.numpy())
    # the NaN problem never converges: it runs as long as the batch's loop, without holding it
    assert int(result.iterations[1]) == int(tf.reduce_max(reference.iterations))


def test_half_precision_cost_is_solved_in_float32():
    cost = _cost(14).numpy()
    half = partial_transport(tf.constant(cost, tf.float16), 0.3, epsilon=0.2)
    full = partial_transport(tf.constant(cost.astype(np.float16).astype(np.float32)), 0.3, epsilon=0.2)
    assert half.plan.dtype == tf.float32
    np.testing.assert_array_equal(half.plan.numpy(), full.plan.numpy())


def test_implicit_gradient_equals_finite_differences():
    cost = _cost(6, (1, 3, 5))
    rng = np.random.default_rng(7)
    w_plan, w_res = tf.constant(rng.normal(size=(1, 3, 5))), tf.constant(rng.normal(size=(1, 5)))

    @tf.function
    def f(c):
        return _loss(partial_transport(c, 0.4, epsilon=1 / 3, max_iter=300, threshold=0), w_plan, w_res)

    theoretical, numerical = tf.test.compute_gradient(f, [cost], delta=1e-6)
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-7)


def test_gradient_with_only_the_plan_used():
    @tf.function
    def gradients(cost):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(cost)
            closed = tf.reduce_sum(partial_transport(cost, 0.3, epsilon=0.2, max_iter=300, threshold=0).plan[:, 0])
            auto = tf.reduce_sum(partial_transport(cost, 0.3, epsilon=0.2, max_iter=300, threshold=0,
                                                   gradient="unrolled").plan[:, 0])
        return tape.gradient(closed, cost), tape.gradient(auto, cost)

    closed, auto = gradients(_cost(8))
    np.testing.assert_allclose(closed, auto, atol=1e-9)


def test_xla_compiles_both_gradients():
    cost = tf.constant(_cost(9).numpy().astype(np.float32))

    @tf.function(jit_compile=True)
    def grads(c):
        out = []
        for mode in GRADIENTS:
            with tf.GradientTape() as tape:
                tape.watch(c)
                value = tf.reduce_sum(partial_transport(c, 0.3, epsilon=0.2, max_iter=50, gradient=mode).residual ** 2)
            out.append(tape.gradient(value, c))
        return out

    closed, auto = grads(cost)
    np.testing.assert_allclose(closed.numpy(), auto.numpy(), atol=1e-5)


@pytest.mark.parametrize("kwargs,name", [({"transport_ratio": 0.0}, "transport_ratio"),
                                         ({"transport_ratio": 1.5}, "transport_ratio"),
                                         ({"epsilon": -1.0}, "epsilon"),
                                         ({"max_iter": 0}, "max_iter"),
                                         ({"threshold": -1e-3}, "threshold"),
                                         ({"gradient": "closed_form"}, "gradient"),
                                         ({"method": "bisection"}, "method")])
def test_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        partial_transport(_cost(0), **kwargs)
    with pytest.raises(ValueError, match="cost"):
        partial_transport(tf.zeros([3]))
