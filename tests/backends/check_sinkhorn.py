"""Sinkhorn, SinkhornMatch and MultiProxyWasserstein on the active Keras backend, against POT, finite differences
and a float32 run of the same layer.

    KERAS_BACKEND=jax python tests/backends/check_sinkhorn.py
"""
import importlib

import keras
import numpy as np
import ot
from keras import ops

from backend_tools import (Report, central_difference, compiled_value_and_grad, fit_and_round_trip, numpy, tensor,
                           value_and_grad)
from ot_layers import MultiProxyWasserstein, SinkhornMatch
from ot_layers.layers.sinkhorn_match import safe_power
from ot_layers.solvers import sinkhorn

report = Report("sinkhorn")
rng = np.random.default_rng(0)


def problems(dtype):
    cost = rng.uniform(0.0, 1.0, (3, 5, 4)).astype(dtype)
    a = rng.uniform(0.2, 1.0, (3, 5)).astype(dtype)
    b = rng.uniform(0.2, 1.0, (3, 4)).astype(dtype)
    a /= a.sum(-1, keepdims=True)
    b /= b.sum(-1, keepdims=True)
    return cost, a, b


def pot_plans(cost, a, b):
    """POT's plans (its own log-domain solver, run to a tight tolerance in float64). The marginals are renormalized
    in float64: float32 marginals miss a unit sum by about 1e-8, which POT's 1e-14 tolerance would never reach."""
    a, b = (m.astype(np.float64) / m.astype(np.float64).sum(-1, keepdims=True) for m in (a, b))
    return np.stack([ot.sinkhorn(a[k], b[k], cost[k].astype(np.float64), 0.1, method="sinkhorn_log", stopThr=1e-14,
                                 numItermax=100000) for k in range(len(cost))])


# Plans against POT.
for dtype, limit in ((np.float64, 1e-5), (np.float32, 1e-4)):
    cost, a, b = problems(dtype)
    reference = pot_plans(cost, a, b)
    for domain in ("log", "kernel"):
        result = sinkhorn(tensor(cost), tensor(a), tensor(b), epsilon=0.1, max_iter=5000, threshold=1e-9,
                          domain=domain)
        name = np.dtype(dtype).name
        report.measure(f"plan_vs_pot_{domain}_{name}", np.abs(numpy(result.plan) - reference).max(), limit)
        report.expect(f"result_dtype_{domain}_{name}", numpy(result.plan).dtype == dtype)

# Both forms of the kernel-domain matrix-vector products (fused multiply-and-sum, einsum), whichever the backend and
# device pick (ot_layers.backends.fused_matvec), give POT's plan.
solver_module = importlib.import_module("ot_layers.solvers.sinkhorn")  # the module (the package exports the function)
picked = solver_module.fused_matvec
try:
    for fused in (True, False):
        solver_module.fused_matvec = lambda matrix, fused=fused: fused
        result = sinkhorn(tensor(cost), tensor(a), tensor(b), epsilon=0.1, max_iter=5000, threshold=1e-9,
                          domain="kernel")
        report.measure(f"plan_vs_pot_kernel_{'fused' if fused else 'einsum'}_matvec_float32",
                       np.abs(numpy(result.plan) - reference).max(), 1e-4)
finally:
    solver_module.fused_matvec = picked

# The result vocabulary: per-problem counts equal to the problems solved alone, and converged flags.
cost, a, b = problems(np.float64)
batch = sinkhorn(tensor(cost), tensor(a), tensor(b), epsilon=0.05, max_iter=300, threshold=1e-6)
alone = [int(numpy(sinkhorn(tensor(cost[k]), tensor(a[k]), tensor(b[k]), epsilon=0.05, max_iter=300,
                            threshold=1e-6).iterations)) for k in range(3)]
report.expect("iterations_per_problem_equal_lone_solves", numpy(batch.iterations).tolist() == alone, str(alone))
report.expect("converged_matches_error", np.array_equal(numpy(batch.converged), numpy(batch.error) <= 1e-6))

# Zero-mass entries: zero plan rows.
a_zero = a.copy()
a_zero[:, 1] = 0.0
a_zero /= a_zero.sum(-1, keepdims=True)
report.measure("zero_mass_row", np.abs(numpy(sinkhorn(tensor(cost), tensor(a_zero), tensor(b), epsilon=0.1).plan)
                                       [:, 1]).max(), 0.0)

# Every custom gradient against central finite differences (float64), for the cost and the marginals (along a
# mass-preserving direction: only those are defined), in both domains and both gradient modes.
weights = tensor(rng.normal(size=cost.shape))
for gradient in ("implicit", "unrolled"):
    for domain in ("log", "kernel"):
        def loss(c, a_, b_):
            result = sinkhorn(c, a_, b_, epsilon=0.1, max_iter=300, threshold=1e-12, domain=domain,
                              gradient=gradient)
            return ops.sum(result.plan * weights) + ops.sum(result.value)

        _, (d_cost, d_a, d_b) = value_and_grad(loss, cost, a, b)
        worst = 0.0
        for _ in range(2):
            direction = rng.normal(size=cost.shape)
            exact = float(np.sum(d_cost * direction))
            worst = max(worst, abs(exact - central_difference(lambda c: loss(c, tensor(a), tensor(b)), cost,
                                                              direction)) / max(1.0, abs(exact)))
        for name, gradient_of, array, of in (("a", d_a, a, lambda x: loss(tensor(cost), x, tensor(b))),
                                             ("b", d_b, b, lambda x: loss(tensor(cost), tensor(a), x))):
            direction = rng.normal(size=array.shape)
            direction -= direction.mean(-1, keepdims=True)
            exact = float(np.sum(gradient_of * direction))
            worst = max(worst, abs(exact - central_difference(of, array, direction)) / max(1.0, abs(exact)))
        report.measure(f"gradient_vs_finite_differences_{gradient}_{domain}", worst, 1e-6)

        compiled = compiled_value_and_grad(loss, cost, a, b)
        if compiled is not None:
            report.measure(f"compiled_gradient_vs_eager_{gradient}_{domain}",
                           np.abs(compiled[1][0] - d_cost).max(), 1e-9)

# Over-relaxed updates: the same fixed point (POT's plan), columns met exactly, the unrolled gradient (which
# differentiates the relaxed loop itself) against finite differences, and fewer updates where plain Sinkhorn is slow.
reference = pot_plans(cost, a, b)
for domain in ("log", "kernel"):
    result = sinkhorn(tensor(cost), tensor(a), tensor(b), epsilon=0.1, max_iter=5000, threshold=1e-9, domain=domain,
                      overrelaxation=1.5)
    report.measure(f"overrelaxed_plan_vs_pot_{domain}_float64", np.abs(numpy(result.plan) - reference).max(), 1e-5)
    report.measure(f"overrelaxed_columns_exact_{domain}", np.abs(numpy(result.plan).sum(-2) - b).max(), 1e-12)

    def relaxed_loss(c):
        result = sinkhorn(c, tensor(a), tensor(b), epsilon=0.1, max_iter=300, threshold=1e-12, domain=domain,
                          gradient="unrolled", overrelaxation=1.5)
        return ops.sum(result.plan * weights)

    _, (d_cost,) = value_and_grad(relaxed_loss, cost)
    direction = rng.normal(size=cost.shape)
    exact = float(np.sum(d_cost * direction))
    report.measure(f"overrelaxed_unrolled_gradient_vs_finite_differences_{domain}",
                   abs(exact - central_difference(relaxed_loss, cost, direction)) / max(1.0, abs(exact)), 1e-6)
slow = dict(epsilon=0.01, max_iter=2000, threshold=1e-6)
plain_updates = numpy(sinkhorn(tensor(cost), tensor(a), tensor(b), **slow).iterations)
relaxed_updates = numpy(sinkhorn(tensor(cost), tensor(a), tensor(b), overrelaxation=1.5, **slow).iterations)
report.expect("overrelaxation_needs_fewer_updates_at_small_epsilon", relaxed_updates.max() < plain_updates.max(),
              f"{relaxed_updates.tolist()} vs plain {plain_updates.tolist()}")

# The cost exponent's custom gradient (p < 1) against finite differences, away from 0.
base = rng.uniform(0.1, 1.0, (6,))
_, (d_base,) = value_and_grad(lambda x: ops.sum(safe_power(x, 0.5) * tensor(np.arange(6.0))), base)
direction = rng.normal(size=base.shape)
fd = central_difference(lambda x: ops.sum(safe_power(x, 0.5) * tensor(np.arange(6.0))), base, direction)
report.measure("safe_power_gradient_vs_finite_differences", abs(np.sum(d_base * direction) - fd), 1e-7)
_, (d_zero,) = value_and_grad(lambda x: ops.sum(safe_power(x, 0.5)), np.zeros(3))
report.expect("safe_power_gradient_finite_at_zero", np.all(np.isfinite(d_zero)))

# SinkhornMatch: plans of the layer equal the solver's on the pairwise cosine costs.
features = rng.normal(size=(2, 6, 8)).astype(np.float32)
targets = rng.normal(size=(3, 4, 8)).astype(np.float32)
plans = numpy(SinkhornMatch(epsilon=0.1, threshold=0.0, max_iter=50)([tensor(features), tensor(targets)]))
unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
cosine_cost = 1.0 - np.einsum("bnd,kmd->bknm", unit(features), unit(targets)).astype(np.float64)
reference = np.stack([[ot.sinkhorn(np.full(6, 1 / 6), np.full(4, 1 / 4), cosine_cost[i, k], 0.1,
                                   method="sinkhorn_log", numItermax=50, stopThr=0.0)
                       for k in range(3)] for i in range(2)])
report.measure("sinkhorn_match_vs_pot", np.abs(plans - reference).max(), 1e-4)

# MultiProxyWasserstein in a model: fit lowers the loss, the .keras file round-trips, mixed precision computes the
# transport in float32 and gives the float32 logits.
x = rng.normal(size=(64, 4, 4, 8)).astype(np.float32)
y = rng.integers(0, 5, size=64)


def mpw_model():
    inputs = keras.Input((4, 4, 8))
    outputs = MultiProxyWasserstein(5, num_proxies=2, name="mpw")(keras.layers.Conv2D(8, 1)(inputs))
    return keras.Model(inputs, outputs)


keras.utils.set_random_seed(0)
model = mpw_model()
fit_and_round_trip(report, model, x, y, epochs=3)

for policy in ("mixed_float16", "mixed_bfloat16"):
    keras.config.set_dtype_policy(policy)
    mixed = mpw_model()
    keras.config.set_dtype_policy("float32")
    mixed.set_weights(model.get_weights())
    logits = numpy(mixed(tensor(x[:8])))
    reference = numpy(model(tensor(x[:8])))
    report.expect(f"{policy}_finite", np.all(np.isfinite(logits.astype(np.float32))))
    scale = np.abs(reference).max()
    report.measure(f"{policy}_logits_vs_float32_relative", np.abs(logits.astype(np.float32) - reference).max() / scale,
                   0.05)

# jit_compile=True with a last, smaller batch (10 = 4 + 4 + 2) after a strided convolution: XLA on TensorFlow and
# JAX; on PyTorch the layer keeps Keras from handing the step to torch.compile, which failed on the new batch size.
keras.utils.set_random_seed(0)
inputs = keras.Input((6, 6, 1))
compiled = keras.Model(inputs, MultiProxyWasserstein(4, num_proxies=2)(keras.layers.Conv2D(8, 2, strides=2)(inputs)))
compiled.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=True)
history = compiled.fit(rng.normal(size=(10, 6, 6, 1)).astype(np.float32), np.arange(10) % 4, epochs=1, batch_size=4,
                       verbose=0)
report.expect("fit_jit_compile_true_with_a_smaller_last_batch", np.isfinite(history.history["loss"][-1]))
report.expect("jit_compile_true_compiles_except_on_pytorch",
              compiled.jit_compile == (keras.backend.backend() != "torch"))

report.finish()
