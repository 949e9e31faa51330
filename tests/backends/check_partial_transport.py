"""GSP's partial transport and the GeneralizedSumPooling layer on the active Keras backend: Prop. 5.2.1's update
(``method="fixed_point"``) against a NumPy re-implementation of it, Newton's method (the default) against scipy's
``brentq`` on the same equation, both against central finite differences, and finiteness of the layer's gradients.

    KERAS_BACKEND=jax python tests/backends/check_partial_transport.py

Prints one JSON line and exits non-zero when a check fails (helpers: ``backend_tools``).
"""
import keras  # noqa: F401
import numpy as np
from keras import ops
from scipy.optimize import brentq
from scipy.special import log_expit, logsumexp

from backend_tools import (BACKEND, Report, central_difference, jitted, numpy, tensor, torch_leaf,
                           value_and_grad)
from ot_layers.layers.generalized_sum_pooling import GeneralizedSumPooling, _clip_norm, _euclidean_cost
from ot_layers.solvers.partial_transport import partial_transport
from ot_layers.solvers.sinkhorn import FIXED_ITERATIONS_TOLERANCE

report = Report("partial_transport")
rng = np.random.default_rng(0)


def reference_solution(cost, ratio, epsilon, max_iter, threshold):
    """Prop. 5.2.1 in NumPy (kernel domain, float64), one problem at a time: from ``t = 1`` relative to the column
    sums divided by their maximum, ``rho <- (1/n) / (1 + t s)``, ``t <- mu / (s^T rho)``, stopping after
    ``max_iter`` updates or once ``mu |1 - t_prev / t|`` is at most ``threshold``; ``pi = t K diag(rho)`` with
    ``rho`` of the previous scaling. Returns ``(residual, plan, scale, iterations, error)`` over the batch."""
    out = []
    for c in cost:
        n = c.shape[-1]
        kernel = np.exp(-c / epsilon)
        s = kernel.sum(axis=0)
        s_max = s.max()
        t_prev = t = 1.0
        count = 0
        error = np.inf
        while count < max_iter and not (threshold and error <= threshold):
            t_prev = t
            t = ratio / np.sum((s / s_max) * (1.0 / n) / (1.0 + t_prev * s / s_max))
            error = ratio * abs(t_prev / t - 1.0)
            count += 1
        rho = (1.0 / n) / (1.0 + t_prev * s / s_max)
        out.append((rho, t * kernel / s_max * rho[None, :], t, count, error))
    return [np.array(values) for values in zip(*out)]


def root_solution(cost, ratio, epsilon):
    """The converged solution in float64, one problem at a time: ``log t`` solving ``(1/n) sum_j sigmoid(log t + log
    s_j) = mu`` (the plan's mass) by Brent's method, then ``rho`` and ``pi`` of Prop. 5.2.1 for it. Returns
    ``(residual, plan)`` over the batch."""
    out = []
    for c in cost:
        log_s = logsumexp(-c / epsilon, axis=0)
        n = log_s.size

        def excess(log_t):
            return np.exp(logsumexp(log_expit(log_t + log_s)) - np.log(n)) - ratio

        log_t = brentq(excess, -log_s.max() - 50.0, -log_s.min() + 50.0, xtol=1e-14, rtol=1e-15, maxiter=500)
        log_rho = -np.log(n) - np.logaddexp(0.0, log_t + log_s)
        out.append((np.exp(log_rho), np.exp(log_t - c / epsilon + log_rho[None])))
    return [np.array(values) for values in zip(*out)]


def layer_gradients(layer, x, upstream):
    """Gradients of ``sum(layer(x) * upstream)`` for the input and the prototypes (a variable), as NumPy."""
    if BACKEND == "jax":  # stateless: the prototypes are an argument of the differentiated function
        fixed = [v.value for v in layer.non_trainable_variables]

        def loss(x, prototypes):
            pooled, _ = layer.stateless_call([prototypes], fixed, x)
            return ops.sum(pooled * upstream)

        _, grads = value_and_grad(loss, x, numpy(layer.prototypes))
        return grads
    if BACKEND == "torch":
        x = torch_leaf(x)
        ops.sum(layer(x) * upstream).backward()
        return x.grad.detach().cpu().numpy(), layer.prototypes.value.grad.detach().cpu().numpy()
    import tensorflow as tf

    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = ops.sum(layer(x) * upstream)
    return [numpy(g) for g in tape.gradient(value, [x, layer.prototypes.value])]


# (a) Prop. 5.2.1's update against the NumPy one, iteration for iteration (float64).
solve_diff = 0.0
iterations_equal = True
converged_ok = True
for ratio, epsilon, max_iter, threshold in ((0.3, 0.2, 100, 1e-6), (0.5, 1.0, 50, 0.0), (0.1, 0.3, 300, 1e-10),
                                            (0.7, 0.5, 7, 0.0)):
    cost = rng.uniform(0.0, 2.0, (3, 4, 9))
    result = partial_transport(tensor(cost), ratio, epsilon=epsilon, max_iter=max_iter, threshold=threshold,
                               method="fixed_point")
    expected = reference_solution(cost, ratio, epsilon, max_iter, threshold)
    for got, want in zip((result.residual, result.plan, result.scale, result.error), expected[:3] + expected[4:]):
        got = numpy(got)
        report.expect("float64_result", got.dtype == np.float64, str(got.dtype))
        solve_diff = max(solve_diff, float(np.abs(got - want).max() / max(1.0, np.abs(want).max())))
    iterations_equal &= numpy(result.iterations).tolist() == expected[3].tolist()
    tolerance = threshold if threshold else FIXED_ITERATIONS_TOLERANCE
    error = numpy(result.error)
    converged_ok &= np.array_equal(numpy(result.converged), np.isfinite(error) & (error <= tolerance))
report.measure("solution_vs_numpy", solve_diff, 1e-10)
# The same solve compiled (jax.jit, tf.function with XLA; PyTorch eager) gives the same plan and counts.
compiled = jitted(lambda c: partial_transport(c, ratio, epsilon=epsilon, max_iter=max_iter, threshold=threshold,
                                             method="fixed_point")[:4])(tensor(cost))
report.measure("compiled_vs_eager", np.abs(numpy(compiled[1]) - numpy(result.plan)).max(), 1e-12)
report.expect("iterations_equal_numpy", iterations_equal)
report.expect("converged_matches_error", converged_ok)

# Newton's method (the default) against the root found by scipy, down to a sharp selection (epsilon 0.01), where it
# needs a handful of evaluations and the update above hundreds.
newton_diff = 0.0
for ratio, epsilon in ((0.3, 0.2), (0.7, 1.0), (0.3, 0.01)):
    cost = rng.uniform(0.0, 2.0, (3, 4, 10))
    result = partial_transport(tensor(cost), ratio, epsilon=epsilon, max_iter=100, threshold=1e-13)
    residual, plan = root_solution(cost, ratio, epsilon)
    newton_diff = max(newton_diff, float(np.abs(numpy(result.plan) - plan).max()),
                      float(np.abs(numpy(result.residual) - residual).max()))
    report.expect(f"newton_converged_{epsilon}", bool(np.all(numpy(result.converged))))
report.measure("newton_vs_scipy_root", newton_diff, 1e-10)
sharp = tensor(np.random.default_rng(23).uniform(0.0, 2.0, (1, 4, 10)))
counts = [int(numpy(partial_transport(sharp, 0.3, epsilon=0.01, max_iter=5000, threshold=1e-6, method=m).iterations)[0])
          for m in ("newton", "fixed_point")]
report.expect("newton_evaluations_few", counts[0] <= 10 and counts[1] > 1000, f"newton {counts[0]}, update {counts[1]}")
compiled = jitted(lambda c: partial_transport(c, 0.3, epsilon=0.01, max_iter=100, threshold=1e-13)[:4])(tensor(cost))
report.measure("newton_compiled_vs_eager", np.abs(numpy(compiled[1]) - numpy(result.plan)).max(), 1e-12)

# mu = 1: global average pooling's closed form; an unbatched cost keeps no batch axis.
cost = rng.uniform(0.0, 2.0, (4, 9))
limit = partial_transport(tensor(cost), 1.0, epsilon=0.2)
softmax = np.exp(-cost / 0.2) / np.exp(-cost / 0.2).sum(axis=0)
report.measure("average_pooling_limit", np.abs(numpy(limit.plan) - softmax / 9).max(), 1e-15)
report.expect("average_pooling_limit_fields", numpy(limit.residual).shape == (9,) and int(numpy(limit.iterations)) == 0
              and bool(numpy(limit.converged)))

# (b) Implicit and unrolled cost gradients of a random linear loss against central differences (float64).
cost = rng.uniform(0.0, 2.0, (2, 3, 5))
w_plan, w_res = tensor(rng.normal(size=(2, 3, 5))), tensor(rng.normal(size=(2, 5)))
for mode, method in (("implicit", "newton"), ("unrolled", "newton"), ("unrolled", "fixed_point")):
    def loss(c, mode=mode, method=method):
        result = partial_transport(c, 0.4, epsilon=1 / 3, max_iter=300, threshold=0, gradient=mode, method=method)
        return ops.sum(result.plan * w_plan) + ops.sum(result.residual * w_res)

    _, (grad,) = value_and_grad(loss, cost)
    numeric = np.zeros_like(cost)
    for index in np.ndindex(*cost.shape):
        direction = np.zeros_like(cost)
        direction[index] = 1.0
        numeric[index] = central_difference(loss, cost, direction)
    report.measure(f"{mode}_{method}_gradient_vs_finite_differences",
                   np.abs(grad - numeric).max() / np.abs(numeric).max(), 1e-6)

# (c) The layer: a float32 GeneralizedSumPooling on a (2, 4, 4, 8) input, its output and gradients.
keras.utils.set_random_seed(0)
inputs = rng.normal(size=(2, 4, 4, 8)).astype(np.float32)
for mode in ("implicit", "unrolled"):
    layer = GeneralizedSumPooling(num_prototypes=5, transport_ratio=0.3, gradient=mode)
    output = numpy(layer(tensor(inputs)))
    report.expect(f"layer_{mode}_output", output.shape == (2, 8) and np.all(np.isfinite(output)), str(output.shape))
    upstream = tensor(rng.normal(size=(2, 8)).astype(np.float32))

    d_input, d_prototypes = layer_gradients(layer, inputs, upstream)
    for name, grad in (("input", d_input), ("prototypes", d_prototypes)):
        report.expect(f"layer_{mode}_gradient_{name}", grad is not None and np.all(np.isfinite(grad))
                      and np.abs(grad).max() > 0, "missing, zero or not finite")

# A float64 layer against the converged solution: the pooled vector is sum_j (sum_k pi_kj / mu) f_j.
layer = GeneralizedSumPooling(num_prototypes=5, transport_ratio=0.3, threshold=1e-13, dtype="float64")
features = rng.normal(size=(2, 4, 4, 8))
pooled = numpy(layer(tensor(features)))
report.expect("layer_float64_dtype", pooled.dtype == np.float64, str(pooled.dtype))
flat = features.reshape(2, 16, 8)
prototypes = numpy(layer.prototypes)
cost = numpy(_euclidean_cost(_clip_norm(tensor(prototypes)), _clip_norm(tensor(flat))))
_, plan = root_solution(cost, 0.3, 0.2)
expected = np.einsum("bn,bnc->bc", plan.sum(axis=1) / 0.3, flat)
report.measure("layer_float64_vs_numpy", np.abs(pooled - expected).max(), 1e-10)
report.finish()
