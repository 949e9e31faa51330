"""The batched Sinkhorn solver against POT, finite differences, and its own invariants."""
import numpy as np
import ot
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from ot_layers.solvers import sinkhorn
from ot_layers.solvers.sinkhorn import FIXED_ITERATIONS_TOLERANCE


def random_problem(rng, batch, n, m, uniform, dtype=np.float64):
    cost = rng.uniform(0.0, 2.0, size=(batch, n, m))
    if uniform:
        a, b = np.full((batch, n), 1.0 / n), np.full((batch, m), 1.0 / m)
    else:
        a, b = rng.uniform(0.2, 1.0, (batch, n)), rng.uniform(0.2, 1.0, (batch, m))
        a, b = a / a.sum(-1, keepdims=True), b / b.sum(-1, keepdims=True)
    return cost.astype(dtype), a.astype(dtype), b.astype(dtype)


def pot_plans(cost, a, b, epsilon):
    return np.stack([
        ot.sinkhorn(a[i], b[i], cost[i], epsilon, method="sinkhorn_log", numItermax=30_000, stopThr=1e-11)
        for i in range(cost.shape[0])
    ])


@pytest.mark.parametrize("dtype, atol", [(np.float64, 1e-5), (np.float32, 1e-4)])
# At epsilon=0.02 the cost range [0, 2] already makes `auto` choose the log domain.
@pytest.mark.parametrize("epsilon, domain", [(1.0, "auto"), (1.0, "log"), (0.1, "auto"), (0.1, "log"), (0.02, "auto")])
@pytest.mark.parametrize("shape", [(3, 5, 4), (2, 9, 13), (1, 16, 16)])
@pytest.mark.parametrize("uniform", [True, False])
def test_plan_equals_pot(dtype, atol, epsilon, domain, shape, uniform):
    rng = np.random.default_rng(hash((shape, uniform, epsilon)) % 2**32)
    cost, a, b = random_problem(rng, *shape, uniform)
    threshold = 1e-10 if dtype == np.float64 else 1e-6
    cast = lambda t: t.astype(dtype)  # noqa: E731
    result = sinkhorn(cast(cost), None if uniform else cast(a), None if uniform else cast(b), epsilon=epsilon,
                      max_iter=20_000, threshold=threshold, domain=domain)
    assert result.plan.dtype == tf.as_dtype(dtype)
    np.testing.assert_allclose(result.plan.numpy(), pot_plans(cost, a, b, epsilon), atol=atol, rtol=0)


def test_kernel_and_log_domains_agree():
    rng = np.random.default_rng(3)
    cost, a, b = random_problem(rng, 4, 7, 6, uniform=False)
    log = sinkhorn(cost, a, b, epsilon=0.1, domain="log", max_iter=5000, threshold=1e-12)
    kernel = sinkhorn(cost, a, b, epsilon=0.1, domain="kernel", max_iter=5000, threshold=1e-12)
    np.testing.assert_allclose(log.plan, kernel.plan, atol=1e-12)
    np.testing.assert_allclose(log.value, kernel.value, atol=1e-10)


def test_result_fields_and_batching():
    rng = np.random.default_rng(4)
    cost = rng.uniform(0, 1, size=(2, 3, 5, 4))
    result = sinkhorn(cost, epsilon=0.5, max_iter=500, threshold=1e-8)
    assert result.plan.shape == (2, 3, 5, 4)
    assert result.f.shape == (2, 3, 5) and result.g.shape == (2, 3, 4)
    assert result.value.shape == result.transport_cost.shape == result.error.shape == (2, 3)
    assert result.iterations.shape == result.converged.shape == (2, 3)
    assert np.all(result.iterations.numpy() > 0) and np.all(result.iterations.numpy() < 500)
    assert float(tf.reduce_max(result.error)) <= 1e-8 and bool(np.all(result.converged.numpy()))
    for index in np.ndindex(2, 3):  # each problem's count is that of the problem solved alone
        alone = sinkhorn(cost[index], epsilon=0.5, max_iter=500, threshold=1e-8)
        assert int(alone.iterations) == int(result.iterations.numpy()[index])
    plan = np.exp((result.f.numpy()[..., :, None] + result.g.numpy()[..., None, :] - cost) / 0.5)
    np.testing.assert_allclose(result.plan, plan, atol=1e-12)
    np.testing.assert_allclose(result.transport_cost, np.sum(plan * cost, axis=(-2, -1)), atol=1e-12)
    entropy_term = 0.5 * np.sum(plan * (np.log(plan) - 1), axis=(-2, -1))
    np.testing.assert_allclose(result.value, result.transport_cost.numpy() + entropy_term, atol=1e-10)
    capped = sinkhorn(cost, epsilon=0.5, max_iter=7, threshold=0.0)
    assert np.all(capped.iterations.numpy() == 7)
    np.testing.assert_array_equal(capped.converged.numpy(), capped.error.numpy() <= FIXED_ITERATIONS_TOLERANCE)
    assert not np.any(sinkhorn(cost, epsilon=0.01, max_iter=1, threshold=None).converged.numpy())


# --- gradients -------------------------------------------------------------------------------------------------

def _objective(cost, a, b, mode, weights):
    result = sinkhorn(cost, a, b, epsilon=0.25, max_iter=5000, threshold=1e-13, gradient=mode)
    assert float(tf.reduce_max(result.error)) <= 1e-13  # gradients are compared at the fixed point
    return (tf.reduce_sum(result.plan * weights) + 0.7 * tf.reduce_sum(result.value)
            + 0.3 * tf.reduce_sum(result.transport_cost))


def _gradients(cost, a, b, mode, weights):
    with tf.GradientTape() as tape:
        tape.watch([cost, a, b])
        loss = _objective(cost, a, b, mode, weights)
    return tape.gradient(loss, [cost, a, b])


def _centred(x):
    return x - np.mean(x, axis=-1, keepdims=True)


@pytest.mark.parametrize("n, m", [(6, 4), (3, 7)])
def test_implicit_and_unrolled_gradients_agree_with_finite_differences(n, m):
    rng = np.random.default_rng(5)
    cost, a, b = (tf.constant(t) for t in random_problem(rng, 2, n, m, uniform=False))
    weights = tf.constant(rng.normal(size=(2, n, m)))
    implicit = _gradients(cost, a, b, "implicit", weights)
    unrolled = _gradients(cost, a, b, "unrolled", weights)
    np.testing.assert_allclose(implicit[0], unrolled[0], atol=1e-8)
    for i in (1, 2):  # marginals: only mass-preserving directions are defined
        np.testing.assert_allclose(_centred(implicit[i].numpy()), _centred(unrolled[i].numpy()), atol=1e-8)

    h = 1e-6
    for _ in range(4):
        direction = rng.normal(size=(2, n, m))
        fd = (_objective(cost + h * direction, a, b, "implicit", weights)
              - _objective(cost - h * direction, a, b, "implicit", weights)) / (2 * h)
        np.testing.assert_allclose(np.sum(implicit[0].numpy() * direction), fd.numpy(), rtol=1e-5, atol=1e-7)
        da = _centred(rng.normal(size=(2, n)))
        fd = (_objective(cost, a + h * da, b, "implicit", weights)
              - _objective(cost, a - h * da, b, "implicit", weights)) / (2 * h)
        np.testing.assert_allclose(np.sum(implicit[1].numpy() * da), fd.numpy(), rtol=1e-5, atol=1e-7)


def test_value_gradient_is_danskin():
    rng = np.random.default_rng(6)
    cost, a, b = (tf.constant(t) for t in random_problem(rng, 1, 5, 5, uniform=False))
    with tf.GradientTape() as tape:
        tape.watch([cost, a, b])
        result = sinkhorn(cost, a, b, epsilon=0.1, max_iter=5000, threshold=1e-13)
        value = tf.reduce_sum(result.value)
    d_cost, d_a, d_b = tape.gradient(value, [cost, a, b])
    np.testing.assert_allclose(d_cost, result.plan, atol=1e-10)
    np.testing.assert_allclose(d_a, _centred(result.f.numpy()), atol=1e-10)
    np.testing.assert_allclose(d_b, _centred(result.g.numpy()), atol=1e-10)


@pytest.mark.parametrize("mode", ["implicit", "unrolled"])
@pytest.mark.parametrize("shape", [(4, 8, 3), (3, 9, 8), (3, 5, 9), (2, 12, 10)])
def test_gradients_under_xla_equal_those_outside_it(mode, shape):
    # Under XLA the products with matrices of at most 8 columns (the cost in the iterations, the plan turned to its
    # smaller side in the backward) and the small Schur solves take another code path (fused elementwise ops).
    rng = np.random.default_rng(7)
    cost = tf.constant(rng.uniform(0, 2, shape))
    weights = tf.constant(rng.normal(size=shape))

    def value_and_grad(c):
        with tf.GradientTape() as tape:
            tape.watch(c)
            result = sinkhorn(c, epsilon=0.1, max_iter=300, threshold=1e-12, gradient=mode)
            loss = tf.reduce_sum(result.transport_cost) + tf.reduce_sum(result.plan * weights)
        return loss, tape.gradient(loss, c)

    xla_loss, xla_grad = tf.function(value_and_grad, jit_compile=True)(cost)
    loss, grad = tf.function(value_and_grad)(cost)
    np.testing.assert_allclose(xla_loss, loss, rtol=1e-10)
    np.testing.assert_allclose(xla_grad, grad, atol=1e-9)


def test_only_costs_of_at_most_8_columns_take_the_fused_products_and_only_under_xla():
    from ot_layers.backends import fused_matvec, fused_small_products

    chosen = {}

    def probe(cost, where):
        chosen[where, cost.shape[-1]] = (fused_small_products(cost), fused_matvec(cost))
        return cost

    for columns in (4, 8, 9, 49):
        tf.function(lambda c: probe(c, "xla"), jit_compile=True)(tf.zeros((2, 5, columns)))
        tf.function(lambda c: probe(c, "graph"))(tf.zeros((2, 5, columns)))
        probe(tf.zeros((2, 5, columns)), "eager")
    fused = {key for key, choice in chosen.items() if all(choice)}
    assert fused == {("xla", 4), ("xla", 8)}, chosen
    assert all(choice[0] == choice[1] for choice in chosen.values()), chosen


@pytest.mark.parametrize("epsilon", [1e-2, 3e-3, 1e-3])
@pytest.mark.parametrize("mode", ["implicit", "unrolled"])
def test_no_nan_or_inf_at_small_epsilon_in_float32(epsilon, mode):
    rng = np.random.default_rng(8)
    cost = tf.constant(rng.uniform(0, 2, (3, 10, 6)).astype("float32"))
    with tf.GradientTape() as tape:
        tape.watch(cost)
        result = sinkhorn(cost, epsilon=epsilon, max_iter=200, gradient=mode)
        loss = tf.reduce_sum(result.value) + tf.reduce_sum(result.plan * cost)
    grad = tape.gradient(loss, cost)
    for tensor in (result.plan, result.value, result.f, result.g, grad):
        assert np.all(np.isfinite(tensor.numpy()))


def test_float16_input_is_solved_in_float32():
    cost = tf.constant(np.random.default_rng(9).uniform(0, 2, (2, 4, 4)), tf.float16)
    result = sinkhorn(cost, epsilon=0.1)
    assert result.plan.dtype == tf.float32


# --- properties ------------------------------------------------------------------------------------------------

problems = st.tuples(st.integers(1, 3), st.integers(2, 8), st.integers(2, 8), st.booleans(),
                     st.sampled_from([1.0, 0.1, 0.05]), st.integers(0, 2**16))


@settings(max_examples=10, deadline=None)
@given(problems)
def test_plans_are_nonnegative_and_meet_marginals(problem):
    batch, n, m, uniform, epsilon, seed = problem
    cost, a, b = random_problem(np.random.default_rng(seed), batch, n, m, uniform, np.float32)
    result = sinkhorn(cost, a, b, epsilon=epsilon, max_iter=2000, threshold=1e-4)
    plan = result.plan.numpy()
    assert np.all(plan >= 0)
    row_error = np.abs(plan.sum(-1) - a).sum(-1) / a.sum(-1)
    np.testing.assert_allclose(result.error.numpy(), row_error, rtol=1e-3, atol=1e-7)  # what the solver reports
    # Each problem stops at the threshold; one above it only when the run used its whole budget (a slow problem:
    # batch 2, n 3, m 2, epsilon 0.05, seed 6389 needs 3,815 iterations, POT's ot.sinkhorn converges slowly too).
    met = row_error <= 1e-4 + 1e-6
    assert np.all(met | (result.iterations.numpy() == 2000))
    np.testing.assert_array_equal(result.converged.numpy(), result.error.numpy() <= 1e-4)
    np.testing.assert_allclose(plan.sum(-2), b, atol=1e-5)


def test_a_slow_problem_meets_the_threshold_given_the_iterations():
    cost, a, b = random_problem(np.random.default_rng(6389), 2, 3, 2, False, np.float32)
    short = sinkhorn(cost, a, b, epsilon=0.05, max_iter=2000, threshold=1e-4)
    long = sinkhorn(cost, a, b, epsilon=0.05, max_iter=20000, threshold=1e-4)
    assert int(short.iterations[1]) == 2000 and short.error.numpy()[1] > 1e-4
    assert not bool(short.converged[1]) and bool(short.converged[0])
    assert int(short.iterations[0]) == int(long.iterations[0]) < 2000
    assert 2000 < int(long.iterations[1]) < 20000 and np.all(long.error.numpy() <= 1e-4)
    np.testing.assert_allclose(long.plan.numpy()[0], short.plan.numpy()[0])  # problem 0 had stopped already


@settings(max_examples=10, deadline=None)
@given(problems)
def test_permutation_equivariance(problem):
    batch, n, m, uniform, epsilon, seed = problem
    rng = np.random.default_rng(seed)
    cost, a, b = random_problem(rng, batch, n, m, uniform)
    rows, cols = rng.permutation(n), rng.permutation(m)
    result = sinkhorn(cost, a, b, epsilon=epsilon, max_iter=5000, threshold=1e-10)
    permuted = sinkhorn(cost[:, rows][:, :, cols], a[:, rows], b[:, cols], epsilon=epsilon, max_iter=5000,
                        threshold=1e-10)
    np.testing.assert_allclose(permuted.plan, result.plan.numpy()[:, rows][:, :, cols], atol=1e-9)


@settings(max_examples=5, deadline=None)
@given(st.integers(3, 8), st.integers(3, 8), st.integers(0, 2**16))
def test_cost_approaches_exact_emd_as_epsilon_shrinks(n, m, seed):
    cost, a, b = random_problem(np.random.default_rng(seed), 1, n, m, uniform=False)
    exact = ot.emd2(a[0], b[0], cost[0])
    gaps = [abs(float(sinkhorn(cost, a, b, epsilon=eps, max_iter=50_000, threshold=1e-9).transport_cost[0]) - exact)
            for eps in (0.5, 0.05, 0.005)]
    assert gaps[2] <= gaps[0] + 1e-9
    assert gaps[2] <= 0.005 * np.log(n * m) + 1e-6


# --- errors ----------------------------------------------------------------------------------------------------

def test_errors_name_the_argument():
    cost = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match="epsilon"):
        sinkhorn(cost, epsilon=0.0)
    with pytest.raises(ValueError, match="epsilon"):
        sinkhorn(cost, epsilon=-1.0)
    with pytest.raises(ValueError, match="max_iter"):
        sinkhorn(cost, max_iter=0)
    with pytest.raises(ValueError, match="domain"):
        sinkhorn(cost, domain="fast")
    with pytest.raises(ValueError, match="gradient"):
        sinkhorn(cost, gradient="magic")
    with pytest.raises(ValueError, match="`cost`.*rank"):
        sinkhorn(np.ones(3))
    with pytest.raises(ValueError, match="`a`"):
        sinkhorn(cost, a=np.ones((2, 5)) / 5)
    with pytest.raises(ValueError, match="`b`.*non-negative"):
        sinkhorn(cost, b=np.array([0.5, 0.75, -0.25, 0.0]))
    with pytest.raises(ValueError, match=r"equal sums per problem \(relative gap 0.5\)\.$"):
        sinkhorn(cost, a=np.full(3, 1 / 3), b=np.full(4, 0.5))
    # uniform weights that bfloat16 rounds (1/3): the sums differ by 1e-3, and the message says why
    with pytest.raises(ValueError, match=r"equal sums .* bfloat16 marginals round .* pass them in float32\.$"):
        sinkhorn(cost, a=tf.fill([3], tf.constant(1 / 3, tf.bfloat16)), b=tf.fill([4], tf.constant(0.25, tf.bfloat16)))


@pytest.mark.parametrize("name", ["cost", "a", "b"])
@pytest.mark.parametrize("bad", [np.array([["1", "2"], ["3", "4"]]), np.ones((2, 2)) * (1 + 1j)],
                         ids=["string", "complex"])
def test_non_real_inputs_are_refused(name, bad):
    """A string tensor failed in the cast with an error naming no argument; a complex one lost its imaginary part."""
    problem = dict(cost=np.ones((2, 2)), a=np.full(2, 0.5), b=np.full(2, 0.5))
    problem[name] = bad if name == "cost" else bad[0]
    with pytest.raises(ValueError, match=f"`{name}` must hold real numbers"):
        sinkhorn(**problem)


@pytest.mark.parametrize("domain, gradient", [("kernel", "implicit"), ("log", "implicit"), ("log", "unrolled")])
def test_each_problem_of_a_batch_ends_where_it_ends_alone(domain, gradient):
    """With a loose threshold, problems that converge at different iterations give in a batch exactly what each gives
    solved alone (a served model's output must not depend on the rest of its batch), and the plan's gradient too."""
    rng = np.random.default_rng(0)
    # easy (flat costs, few iterations) and hard (spread costs, many iterations) problems in one batch
    scales = np.array([0.05, 1.0, 3.0, 0.3])[:, None, None]
    cost = tf.constant(scales * rng.uniform(size=(4, 6, 5)), tf.float64)
    options = dict(epsilon=0.1, max_iter=200, threshold=0.05, domain=domain, gradient=gradient)
    upstream = tf.constant(rng.normal(size=(4, 6, 5)), tf.float64)

    def plan_and_gradient(c, g):
        with tf.GradientTape() as tape:
            tape.watch(c)
            loss = tf.reduce_sum(sinkhorn(c, **options).plan * g)
        return sinkhorn(c, **options).plan.numpy(), tape.gradient(loss, c).numpy()

    batch_plan, batch_gradient = plan_and_gradient(cost, upstream)
    iterations = []
    for k in range(4):
        alone_plan, alone_gradient = plan_and_gradient(cost[k:k + 1], upstream[k:k + 1])
        np.testing.assert_allclose(batch_plan[k], alone_plan[0], rtol=0, atol=1e-12)
        np.testing.assert_allclose(batch_gradient[k], alone_gradient[0], rtol=0, atol=1e-10)
        iterations.append(int(sinkhorn(cost[k:k + 1], **options).iterations[0]))
    assert len(set(iterations)) > 1  # the problems do stop at different iterations
    assert sinkhorn(cost, **options).iterations.numpy().tolist() == iterations  # and the batch reports each one
