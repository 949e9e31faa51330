"""Newton's method for GSP's scaling (``partial_transport(method="newton")``, the default) against a bracketing root
finder (scipy's ``brentq``) on the same equation, against Prop. 5.2.1's update (Gurbuz 2022 thesis) where that
converges, and where it does not: sharp selections and a transported mass with a plateau."""
import numpy as np
import pytest
import tensorflow as tf
from scipy.optimize import brentq
from scipy.special import log_expit, logsumexp

from ot_layers.solvers import partial_transport

RATIO = 0.3


def _sharp_cost():
    """A ``(4, 10)`` cost whose selection is sharp at small epsilon (Prop. 5.2.1 needs 1,781 updates at 0.01)."""
    return np.random.default_rng(23).uniform(0.0, 2.0, size=(4, 10))


def _excess_mass(log_t, log_s, ratio):
    """``g(log t) - mu``: the mass ``(1/n) sum_j sigmoid(log t + log s_j)`` the scaling transports, minus ``mu``."""
    return np.exp(logsumexp(log_expit(log_t + log_s)) - np.log(log_s.size)) - ratio


def _reference_log_scale(cost, ratio, epsilon):
    """``log t`` solving ``g(log t) = mu`` (the plan's mass equals ``mu``), with ``log s_j = logsumexp_k(-c_kj /
    epsilon)``: Brent's method on a sign-changing bracket, in float64."""
    log_s = logsumexp(-cost / epsilon, axis=0)

    def excess(log_t):
        return _excess_mass(log_t, log_s, ratio)

    low, high = -log_s.max() - 50.0, -log_s.min() + 50.0
    assert excess(low) < 0 < excess(high)
    return brentq(excess, low, high, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500), log_s


def _residual_and_plan(cost, epsilon, log_t, log_s):
    """``rho_j = (1/n) / (1 + t s_j)`` and ``pi = t K diag(rho)`` of Prop. 5.2.1 for a given scaling."""
    n = log_s.size
    log_rho = -np.log(n) - np.logaddexp(0.0, log_t + log_s)
    return np.exp(log_rho), np.exp(log_t - cost / epsilon + log_rho[None])


@pytest.mark.parametrize("epsilon", [2.0, 0.2, 0.01, 1e-3])
def test_solution_equals_a_bracketing_root_finder(epsilon):
    cost = _sharp_cost()
    log_t, log_s = _reference_log_scale(cost, RATIO, epsilon)
    rho, plan = _residual_and_plan(cost, epsilon, log_t, log_s)
    result = partial_transport(tf.constant(cost), RATIO, epsilon=epsilon, max_iter=100, threshold=1e-13)
    assert bool(result.converged) and int(result.iterations) <= 12
    np.testing.assert_allclose(result.residual.numpy(), rho, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(result.plan.numpy(), plan, rtol=1e-9, atol=1e-15)
    # ``scale`` is t relative to the largest column sum, and solves the equation (at epsilon 1e-3 three elements
    # of ten hold mu = 0.3 over a wide range of t, so t itself is not determined there)
    assert abs(_excess_mass(np.log(float(result.scale)) - log_s.max(), log_s, RATIO)) < 1e-12


def test_newton_and_prop_5_2_1_reach_the_same_solution_where_both_converge():
    costs = tf.constant(np.random.default_rng(5).uniform(0.0, 2.0, size=(6, 8, 20)))
    for epsilon in (0.5, 0.1):
        newton = partial_transport(costs, RATIO, epsilon=epsilon, max_iter=5000, threshold=1e-13)
        update = partial_transport(costs, RATIO, epsilon=epsilon, max_iter=5000, threshold=1e-13,
                                   method="fixed_point")
        assert np.all(newton.converged.numpy()) and np.all(update.converged.numpy())
        assert np.all(newton.iterations.numpy() < update.iterations.numpy())
        for field in ("residual", "plan", "scale"):
            np.testing.assert_allclose(getattr(newton, field).numpy(), getattr(update, field).numpy(), rtol=1e-9,
                                       atol=1e-15, err_msg=f"{field} at epsilon {epsilon}")


def test_sharp_selection_needs_a_few_evaluations_where_prop_5_2_1_needs_thousands():
    cost = tf.constant(_sharp_cost())
    newton = partial_transport(cost, RATIO, epsilon=0.01, max_iter=5000, threshold=1e-6)
    update = partial_transport(cost, RATIO, epsilon=0.01, max_iter=5000, threshold=1e-6, method="fixed_point")
    assert bool(newton.converged) and bool(update.converged)
    assert int(newton.iterations) <= 10 and int(update.iterations) > 1000
    # at epsilon 1e-3 the update does not reach 1e-6 in 2,000 iterations; Newton's method does, in float32 too
    for dtype in (tf.float64, tf.float32):
        sharper = tf.constant(_sharp_cost(), dtype)
        stalled = partial_transport(sharper, RATIO, epsilon=1e-3, max_iter=2000, threshold=1e-6, method="fixed_point")
        solved = partial_transport(sharper, RATIO, epsilon=1e-3, max_iter=100, threshold=1e-6)
        assert not bool(stalled.converged) and bool(solved.converged) and int(solved.iterations) <= 12
        log_t, log_s = _reference_log_scale(_sharp_cost(), RATIO, 1e-3)
        _, plan = _residual_and_plan(_sharp_cost(), 1e-3, log_t, log_s)
        np.testing.assert_allclose(solved.plan.numpy(), plan, rtol=0, atol=1e-5)


def test_a_plateau_in_the_transported_mass_falls_back_to_bisection():
    """Half the elements have column sums ``e^200`` times the others': the mass rises to 1/2, stays there over a
    range of ``log t`` about 200 wide, then rises to 1. For ``mu = 0.7`` the root lies past the plateau, where the
    slope Newton's step divides by is ~1e-80: the step leaves the bracket and its midpoint is taken instead."""
    epsilon = 0.01
    cost = np.concatenate([np.zeros((1, 5)), np.full((1, 5), 200 * epsilon)], axis=1)
    log_t, log_s = _reference_log_scale(cost, 0.7, epsilon)
    assert 190 < log_t < 200
    rho, plan = _residual_and_plan(cost, epsilon, log_t, log_s)
    for dtype, tolerance in ((tf.float64, 1e-9), (tf.float32, 1e-5)):
        result = partial_transport(tf.constant(cost, dtype), 0.7, epsilon=epsilon, max_iter=200, threshold=1e-6)
        assert bool(result.converged) and int(result.iterations) <= 40
        np.testing.assert_allclose(result.plan.numpy(), plan, rtol=0, atol=tolerance)
        np.testing.assert_allclose(result.residual.numpy(), rho, rtol=0, atol=tolerance)
    crawling = partial_transport(tf.constant(cost), 0.7, epsilon=epsilon, max_iter=200, threshold=1e-6,
                                 method="fixed_point")
    assert not bool(crawling.converged)


@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
def test_gradient_at_a_sharp_selection_equals_finite_differences(gradient):
    cost = _sharp_cost()[None]
    rng = np.random.default_rng(2)
    weights_plan, weights_residual = rng.normal(size=cost.shape), rng.normal(size=cost[:, 0].shape)
    kwargs = dict(epsilon=0.01, max_iter=60, threshold=0, gradient=gradient)

    @tf.function
    def loss(c):
        result = partial_transport(c, RATIO, **kwargs)
        return tf.reduce_sum(result.plan * weights_plan) + tf.reduce_sum(tf.sin(9.0 * result.residual) *
                                                                         weights_residual)

    with tf.GradientTape() as tape:
        c = tf.constant(cost)
        tape.watch(c)
        value = loss(c)
    analytic = tape.gradient(value, c).numpy()
    assert np.all(np.isfinite(analytic)) and np.abs(analytic).max() > 1e-3
    for index in [tuple(rng.integers(0, s) for s in cost.shape) for _ in range(5)]:
        step = np.zeros_like(cost)
        step[index] = 1e-6
        numeric = (float(loss(tf.constant(cost + step))) - float(loss(tf.constant(cost - step)))) / 2e-6
        np.testing.assert_allclose(analytic[index], numeric, rtol=0, atol=1e-6 * np.abs(analytic).max())


def test_the_layer_takes_either_method_and_both_pool_alike():
    from ot_layers import GeneralizedSumPooling

    features = np.random.default_rng(8).normal(size=(3, 5, 5, 6)).astype("float32")
    layers = {method: GeneralizedSumPooling(7, 0.3, epsilon=0.1, max_iter=1000, threshold=1e-7, method=method,
                                            return_attributes=True, initializer="glorot_uniform")
              for method in ("newton", "fixed_point")}
    layers["newton"].build(features.shape)
    layers["fixed_point"].build(features.shape)
    layers["fixed_point"].set_weights(layers["newton"].get_weights())
    outputs = {method: [np.asarray(x) for x in layer(features)] for method, layer in layers.items()}
    for newton, fixed_point in zip(outputs["newton"], outputs["fixed_point"]):
        np.testing.assert_allclose(newton, fixed_point, rtol=0, atol=1e-5)
    flat = layers["newton"].flat_features(features)
    iterations = {method: np.asarray(layer.transport(flat).iterations) for method, layer in layers.items()}
    assert np.all(iterations["fixed_point"] > iterations["newton"])  # the argument reaches the solver
    config = layers["fixed_point"].get_config()
    assert GeneralizedSumPooling.from_config(config).method == "fixed_point"
    del config["method"]  # a model saved before the layer had the argument
    assert GeneralizedSumPooling.from_config(config).method == "newton"
    with pytest.raises(ValueError, match="`method`") as error:
        GeneralizedSumPooling(method="sinkhorn")
    assert "\n" not in str(error.value)
