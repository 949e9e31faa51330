"""Over-relaxed Sinkhorn (``overrelaxation=w``): the fixed point of plain Sinkhorn (POT's plan), columns met exactly,
per-problem stopping and zero-mass entries as before, fewer updates where plain Sinkhorn is slow, and a factor too
large reported by ``converged``, not hidden."""
import warnings

import numpy as np
import ot
import pytest
import tensorflow as tf

from ot_layers.solvers import emd, sinkhorn


def cosine_problems(count=40, nodes=25, dim=64, seed=0):
    """Cosine costs between Gaussian node sets with positive non-uniform weights: DeepEMD's problems, where the
    entropic solver at epsilon 0.03 needs tens of plain updates."""
    rng = np.random.default_rng(seed)
    u, v = (rng.standard_normal((count, nodes, dim)) for _ in range(2))
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    v /= np.linalg.norm(v, axis=-1, keepdims=True)
    a, b = (rng.uniform(0.1, 1.1, (count, nodes)) for _ in range(2))
    return 1.0 - np.einsum("pnd,pmd->pnm", u, v), a / a.sum(-1, keepdims=True), b / b.sum(-1, keepdims=True)


def small_problems(seed=1):
    rng = np.random.default_rng(seed)
    cost = rng.uniform(0.0, 1.0, (3, 6, 5))
    a, b = rng.uniform(0.2, 1.0, (3, 6)), rng.uniform(0.2, 1.0, (3, 5))
    return cost, a / a.sum(-1, keepdims=True), b / b.sum(-1, keepdims=True)


def pot_plans(cost, a, b, epsilon):
    return np.stack([ot.sinkhorn(a[k], b[k], cost[k], epsilon, method="sinkhorn_log", stopThr=1e-14,
                                 numItermax=100_000) for k in range(len(cost))])


@pytest.mark.parametrize("domain", ["log", "kernel"])
@pytest.mark.parametrize("overrelaxation", [0.5, 1.3, 1.7])
def test_overrelaxed_plan_equals_pot_and_meets_the_columns(domain, overrelaxation):
    cost, a, b = small_problems()
    result = sinkhorn(cost, a, b, epsilon=0.1, max_iter=10_000, threshold=1e-11, domain=domain,
                      overrelaxation=overrelaxation)
    np.testing.assert_allclose(result.plan.numpy(), pot_plans(cost, a, b, 0.1), atol=1e-9, rtol=0)
    np.testing.assert_allclose(result.plan.numpy().sum(-2), b, atol=1e-14, rtol=0)
    # the last plain column update moves the rows by about what the loop left: near the threshold, not far above
    assert result.error.numpy().max() < 1e-10


@pytest.mark.parametrize("domain", ["log", "kernel"])
def test_overrelaxation_cuts_the_updates_where_plain_sinkhorn_is_slow(domain):
    cost, a, b = cosine_problems()
    options = dict(epsilon=0.03, max_iter=1000, threshold=1e-3, domain=domain)
    plain = sinkhorn(cost, a, b, **options)
    relaxed = sinkhorn(cost, a, b, overrelaxation=1.5, **options)
    assert bool(tf.reduce_all(plain.converged)) and bool(tf.reduce_all(relaxed.converged))
    # the batch runs until its slowest problem stops
    assert int(tf.reduce_max(relaxed.iterations)) <= 0.6 * int(tf.reduce_max(plain.iterations))
    # the same fixed point: the plans differ by what the threshold leaves, not more
    exact = np.array([ot.emd2(a[k], b[k], cost[k]) for k in range(len(cost))])
    for result in (plain, relaxed):
        assert np.max(np.abs(result.transport_cost.numpy() - exact) / exact) < 0.03


def test_overrelaxation_slows_problems_that_plain_sinkhorn_solves_fast():
    """The factor that helps at small epsilon costs updates where plain Sinkhorn contracts fast (why 1 stays the
    default): at epsilon 0.1 on the cosine problems, 1.5 needs more updates than 1."""
    cost, a, b = cosine_problems(count=5)
    options = dict(epsilon=0.1, max_iter=10_000, threshold=1e-12)
    plain = sinkhorn(cost, a, b, **options).iterations.numpy()
    relaxed = sinkhorn(cost, a, b, overrelaxation=1.5, **options).iterations.numpy()
    assert relaxed.max() > plain.max()


def test_each_problem_ends_where_it_ends_alone():
    cost, a, b = cosine_problems(count=6)
    options = dict(epsilon=0.03, max_iter=500, threshold=1e-4, overrelaxation=1.6)
    batch = sinkhorn(cost, a, b, **options)
    for k in range(len(cost)):
        alone = sinkhorn(cost[k], a[k], b[k], **options)
        assert int(batch.iterations[k]) == int(alone.iterations)
        np.testing.assert_allclose(batch.plan[k].numpy(), alone.plan.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("domain", ["log", "kernel"])
@pytest.mark.parametrize("gradient", ["implicit", "unrolled"])
def test_zero_mass_entries_stay_zero(domain, gradient):
    cost, a, b = small_problems()
    a[:, 2], b[:, 0] = 0.0, 0.0
    a, b = a / a.sum(-1, keepdims=True), b / b.sum(-1, keepdims=True)
    cost = tf.constant(cost)
    with tf.GradientTape() as tape:
        tape.watch(cost)
        result = sinkhorn(cost, a, b, epsilon=0.1, max_iter=5000, threshold=1e-11, domain=domain,
                          gradient=gradient, overrelaxation=1.4)
        loss = tf.reduce_sum(result.plan * np.arange(cost.shape[-1], dtype=np.float64))
    d_cost = tape.gradient(loss, cost).numpy()
    plan = result.plan.numpy()
    assert np.all(plan[:, 2, :] == 0.0) and np.all(plan[:, :, 0] == 0.0)
    assert np.all(np.isfinite(d_cost)) and np.all(np.isfinite(result.f.numpy()))
    reduced = pot_plans(cost.numpy()[:, [0, 1, 3, 4, 5]][:, :, 1:], a[:, [0, 1, 3, 4, 5]], b[:, 1:], 0.1)
    np.testing.assert_allclose(plan[:, [0, 1, 3, 4, 5]][:, :, 1:], reduced, atol=1e-9, rtol=0)


def test_implicit_gradient_matches_finite_differences():
    cost, a, b = small_problems()
    weights = np.random.default_rng(2).normal(size=cost.shape)

    def loss(c):
        result = sinkhorn(c, a, b, epsilon=0.1, max_iter=5000, threshold=1e-12, overrelaxation=1.5)
        return float(tf.reduce_sum(result.plan * weights) + tf.reduce_sum(result.value))

    c = tf.constant(cost)
    with tf.GradientTape() as tape:
        tape.watch(c)
        result = sinkhorn(c, a, b, epsilon=0.1, max_iter=5000, threshold=1e-12, overrelaxation=1.5)
        value = tf.reduce_sum(result.plan * weights) + tf.reduce_sum(result.value)
    gradient = tape.gradient(value, c).numpy()
    direction = np.random.default_rng(3).normal(size=cost.shape)
    step = 1e-6
    numeric = (loss(cost + step * direction) - loss(cost - step * direction)) / (2 * step)
    assert abs(np.sum(gradient * direction) - numeric) < 1e-6 * max(1.0, abs(numeric))


def test_a_factor_too_large_is_reported_by_converged():
    cost, a, b = cosine_problems(count=10)
    result = sinkhorn(cost, a, b, epsilon=0.03, max_iter=200, threshold=1e-3, domain="log", overrelaxation=1.95)
    converged = result.converged.numpy()
    assert not converged.all()
    error = result.error.numpy()
    np.testing.assert_array_equal(converged, np.isfinite(error) & (error <= 1e-3))


@pytest.mark.parametrize("bad", [0.0, 2.0, -1.0, 2.5, float("nan"), "fast", True, None])
def test_a_factor_outside_the_open_interval_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="`overrelaxation` must lie in"):
        sinkhorn(np.ones((2, 3)), overrelaxation=bad)
    with pytest.raises(ValueError, match="`overrelaxation` must lie in"):
        emd(np.ones((2, 3)), method="sinkhorn", overrelaxation=bad)


def test_emd_passes_it_to_the_entropic_solver_and_the_exact_one_warns_that_it_ignores_it():
    cost, a, b = cosine_problems(count=5)
    entropic = emd(cost, a, b, method="sinkhorn", overrelaxation=1.5)
    direct = sinkhorn(cost, a, b, epsilon=0.03, max_iter=100, threshold=1e-3, overrelaxation=1.5)
    np.testing.assert_array_equal(entropic.iterations.numpy(), direct.iterations.numpy())
    with pytest.warns(UserWarning, match=r'emd\(method="exact"\) ignores overrelaxation=1.5'):
        emd(cost, a, b, overrelaxation=1.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        emd(cost, a, b)  # the default says nothing
