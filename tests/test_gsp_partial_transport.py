"""Partial transport solver (Prop. 5.2.1) and its closed-form gradient (Prop. 5.2.2)."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize

from ot_layers.solvers import partial_transport


def _cost(seed, shape=(2, 4, 9)):
    return tf.constant(np.random.default_rng(seed).uniform(0.0, 2.0, size=shape))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 10_000), ratio=st.floats(0.05, 0.8), gamma=st.floats(0.5, 10.0))
def test_constraints_hold_at_the_fixed_point(seed, ratio, gamma):
    cost = _cost(seed)
    result = tf.function(partial_transport)(cost, ratio, gamma, max_iter=1000)
    n = cost.shape[-1]
    np.testing.assert_allclose(result.residual + tf.reduce_sum(result.plan, axis=1), 1.0 / n, atol=1e-10)
    np.testing.assert_allclose(tf.reduce_sum(result.plan, axis=[1, 2]), ratio, atol=1e-10)
    assert np.all(result.residual.numpy() >= 0) and np.all(result.plan.numpy() >= 0)


def _objective(cost, gamma, rho, plan):
    entropy = np.sum(plan * np.log(plan)) + np.sum(rho * np.log(rho))
    return np.sum(cost * plan) + entropy / gamma


def test_minimizes_problem_p2_like_a_generic_solver():
    cost = np.random.default_rng(3).uniform(0, 2, size=(3, 5))
    ratio, gamma = 0.4, 2.0
    m, n = cost.shape
    result = partial_transport(tf.constant(cost), ratio, gamma, max_iter=500)
    ours = _objective(cost, gamma, result.residual.numpy(), result.plan.numpy())

    def unpack(v):
        return v[:n], v[n:].reshape(m, n)

    constraints = [{"type": "eq", "fun": lambda v: unpack(v)[0] + unpack(v)[1].sum(0) - 1.0 / n},
                   {"type": "eq", "fun": lambda v: unpack(v)[1].sum() - ratio}]
    start = np.concatenate([np.full(n, (1 - ratio) / n), np.full(m * n, ratio / (m * n))])
    reference = minimize(lambda v: _objective(cost, gamma, *unpack(v)), start, method="SLSQP",
                         constraints=constraints, bounds=[(1e-12, None)] * len(start),
                         options={"ftol": 1e-14, "maxiter": 1000})
    assert reference.success
    assert ours <= reference.fun + 1e-9
    np.testing.assert_allclose(result.plan.numpy(), unpack(reference.x)[1], atol=1e-5)


def test_unbatched_and_ratio_one_is_average_pooling_limit():
    cost = _cost(1, (4, 9))
    result = partial_transport(cost, 1.0, 5.0)
    assert result.residual.shape == (9,) and result.plan.shape == (4, 9)
    np.testing.assert_array_equal(result.residual.numpy(), 0.0)
    np.testing.assert_allclose(tf.reduce_sum(result.plan, axis=0), 1.0 / 9, atol=1e-15)
    # mu -> 1 from below approaches the same plan
    near = tf.function(partial_transport)(cost, 0.999, 5.0, max_iter=3000)
    np.testing.assert_allclose(near.plan.numpy(), result.plan.numpy(), rtol=1e-2, atol=1e-6)


def test_large_inverse_temperature_does_not_underflow():
    cost = tf.constant(np.random.default_rng(0).uniform(5.0, 7.0, size=(1, 4, 9)), tf.float32)
    result = partial_transport(cost, 0.3, 100.0, max_iter=200)
    assert np.all(np.isfinite(result.plan.numpy()))
    np.testing.assert_allclose(tf.reduce_sum(result.plan), 0.3, rtol=1e-4)


def _loss(result, weights_plan, weights_residual):
    return tf.reduce_sum(result.plan * weights_plan) + tf.reduce_sum(tf.sin(result.residual * 9.0) * weights_residual)


@pytest.mark.parametrize("ratio,gamma", [(0.3, 5.0), (0.7, 0.5), (0.1, 10.0)])
def test_closed_form_gradient_equals_autodiff_through_converged_solve(ratio, gamma):
    cost = _cost(4)
    rng = np.random.default_rng(5)
    w_plan, w_res = tf.constant(rng.normal(size=(2, 4, 9))), tf.constant(rng.normal(size=(2, 9)))
    grads = {}
    for mode in ("closed_form", "autodiff"):
        @tf.function
        def gradient(c):
            with tf.GradientTape() as tape:
                tape.watch(c)
                value = _loss(partial_transport(c, ratio, gamma, max_iter=400, gradient=mode), w_plan, w_res)
            return tape.gradient(value, c)

        grads[mode] = gradient(cost).numpy()
    assert np.abs(grads["autodiff"]).max() > 1e-3
    np.testing.assert_allclose(grads["closed_form"], grads["autodiff"], atol=1e-6, rtol=0)


def test_closed_form_gradient_equals_finite_differences():
    cost = _cost(6, (1, 3, 5))
    rng = np.random.default_rng(7)
    w_plan, w_res = tf.constant(rng.normal(size=(1, 3, 5))), tf.constant(rng.normal(size=(1, 5)))

    @tf.function
    def f(c):
        return _loss(partial_transport(c, 0.4, 3.0, max_iter=300), w_plan, w_res)

    theoretical, numerical = tf.test.compute_gradient(f, [cost], delta=1e-6)
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-7)


def test_gradient_with_only_the_plan_used():
    @tf.function
    def gradients(cost):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(cost)
            closed = tf.reduce_sum(partial_transport(cost, 0.3, 5.0, 300).plan[:, 0])
            auto = tf.reduce_sum(partial_transport(cost, 0.3, 5.0, 300, gradient="autodiff").plan[:, 0])
        return tape.gradient(closed, cost), tape.gradient(auto, cost)

    closed, auto = gradients(_cost(8))
    np.testing.assert_allclose(closed, auto, atol=1e-9)


def test_xla_compiles_both_gradients():
    cost = tf.constant(_cost(9).numpy().astype(np.float32))

    @tf.function(jit_compile=True)
    def grads(c):
        out = []
        for mode in ("closed_form", "autodiff"):
            with tf.GradientTape() as tape:
                tape.watch(c)
                value = tf.reduce_sum(partial_transport(c, 0.3, 5.0, 50, gradient=mode).residual ** 2)
            out.append(tape.gradient(value, c))
        return out

    closed, auto = grads(cost)
    np.testing.assert_allclose(closed.numpy(), auto.numpy(), atol=1e-5)


@pytest.mark.parametrize("kwargs,name", [({"transport_ratio": 0.0}, "transport_ratio"),
                                         ({"transport_ratio": 1.5}, "transport_ratio"),
                                         ({"inverse_temperature": -1.0}, "inverse_temperature"),
                                         ({"max_iter": 0}, "max_iter"),
                                         ({"gradient": "implicit"}, "gradient")])
def test_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        partial_transport(_cost(0), **kwargs)
    with pytest.raises(ValueError, match="cost"):
        partial_transport(tf.zeros([3]))
