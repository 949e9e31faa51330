"""GeneralizedSumPooling forward+backward on each Keras backend, beside OTT-JAX on the same partial-transport problem.

A separate script rather than a new section of ``benchmarks/gsp.py``: that script imports TensorFlow at module level
and is a 40-configuration TensorFlow sweep whose ``gsp.json`` holds a 100-round run; adding a section there would mean
re-running (or patching) that sweep, while this measurement needs a process per backend, coordinated by a parent
that imports no framework (the design of ``benchmarks/sinkhorn.py``).

Workload (``gsp.py``'s ``layer`` workload at its default shape): B=64 feature maps of 14x14x128 (uniform in [0, 1]),
m=64 prototypes, mu=0.3, epsilon=0.2, the implicit gradient (Gurbuz 2022 thesis, Prop. 5.2.2), 50 iterations of
Prop. 5.2.1 with the convergence check off (``threshold=0``); loss ``sum(pooled * w) + sum(z^2)`` (``z`` the
pseudo-attributes, Eq. 5.2.3), gradients w.r.t. the feature map and the prototypes. Timed:

  otzoo_tf_xla       the layer on Keras' TensorFlow backend, ``tf.function(jit_compile=True)`` around a GradientTape;
  otzoo_jax_jit      the layer on the JAX backend, ``jax.jit(jax.value_and_grad(...))`` of ``layer.stateless_call``;
  otzoo_torch_eager  the layer on the PyTorch backend, eager, ``loss.backward()``, with PyTorch's default intra-op
                     threads and (``_1thread``) with ``torch.set_num_threads(1)``: when other processes load the
                     cores of a small shared machine, PyTorch's OpenMP pool of 2 threads slows down several-fold;
  ott_*              OTT-JAX (no GSP of its own) solving the same problem, written below in ``jax.numpy``.

The OTT-JAX formulation. Problem (P2) (thesis, ch. 5) is ``min <c, pi> + eps (sum pi log pi + sum rho log rho)``
subject to ``rho_j + sum_k pi_kj = 1/n`` and ``sum_kj pi_kj = mu``: the prototypes' own marginals are free, only their
total is fixed. Adding one dummy column with zero cost to an ``n x m`` problem is therefore *not* (P2): a balanced
problem would fix each prototype's mass (``mu/m`` each, say), a different plan (the check below measures by how
much). Minimizing first over how an element's transported mass ``q_j`` is split among the prototypes gives
``pi_kj = q_j softmax_k(-c_kj / eps)`` and the value ``q_j (eps log q_j - eps log s_j)``, ``s_j = sum_k
exp(-c_kj / eps)``; what remains is a balanced entropic OT problem of ``n`` elements (mass ``1/n`` each) against two
columns, ``transported`` (mass ``mu``, cost ``-eps log s_j``, the soft minimum of the element's costs) and the dummy
``residual`` (mass ``1 - mu``, cost 0); its plan's columns are ``q`` and ``rho``. That ``n x 2`` problem is solved by
``ott.solvers.linear.sinkhorn.Sinkhorn`` on an ``ott.geometry.geometry.Geometry(cost_matrix=..., epsilon=0.2)``
(absolute epsilon, kernel ``exp(-C / 0.2)``), vmapped over the batch, jit-compiled, exactly 50 iterations
(``min_iterations = max_iterations = 50``, threshold off), then ``pi`` is rebuilt by the softmax above. Prop. 5.2.1
is Sinkhorn's iteration on this two-column problem with the dummy's scaling held at 1 (``t`` is the ratio of the two
column scalings), so both sides do ``O(n)`` work per iteration after the same ``O(mn)`` soft minimum. The timed
OTT-JAX function does the layer's whole work (norm clipping, Euclidean cost, solve, pooling, attributes, the loss),
so the comparison is of the layer workload; OTT-JAX is timed with its implicit differentiation (``ImplicitDiff``,
the counterpart of Prop. 5.2.2, with ``solver_kwargs={"ridge_kernel": 1.0}``: without it OTT-JAX's linear solve
returns non-finite values in float32 here, its system being singular along the potentials' constant shift) and
with unrolled differentiation (``implicit_diff=None``), in its log (``lse_mode=True``) and kernel modes.

Before timing, two checks run in their own processes on the JAX backend: (1) in float64 on small random costs,
otzoo's ``partial_transport`` and the two-column OTT-JAX formulation, both converged, give the same plan and residual
and the same implicit cost gradient (and the naive ``m + 1``-column formulation does not); (2) in float32 on the
benchmark's own cost at 50 iterations, the plans, the loss and the gradients of the timed functions agree.

Timing: every method runs in its own subprocess (``KERAS_BACKEND`` set for otzoo's); each compiles and warms up,
then the parent asks each in turn for one timed step, ``--repeats`` rounds, the order rotated every round, so that
the load of other processes on this shared machine affects all alike (interleaved rounds). Reported: median and
minimum per method, and their ratios to OTT-JAX's fastest variant and to TensorFlow XLA.

    python benchmarks/gsp_backends.py [--repeats 10] [--out benchmarks/results/gsp_backends.json]

Where TensorFlow is not installed (the GPU machine), ``otzoo_tf_xla`` is reported as skipped and the ratios are
against OTT-JAX; on a GPU the other workers run there (each result names its ``device``; PyTorch's ``float(loss)``
waits for the device's queued work, backward included).
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import accelerator  # benchmarks/accelerator.py (imports no framework until called)
from report import positive_count, write_json

SHAPE = {"batch": 64, "side": 14, "channels": 128, "prototypes": 64}
TRANSPORT_RATIO = 0.3
EPSILON = 0.2
ITERATIONS = 50
OTT_INNER_ITERATIONS = 10  # OTT-JAX checks its error every 10 iterations (its default); 50 is a multiple of it
# OTT-JAX's implicit linear system is singular along the potentials' gauge (f + c, g - c); with the default solver
# (lineax NormalCG, no ridge) its solve is non-finite in float32 for this benchmark's loss. ``ridge_kernel``, OTT-JAX's
# option for balanced problems, selects the zero-sum solution; the gradient w.r.t. the cost does not depend on it.
OTT_RIDGE_KERNEL = 1.0
WARMUP_CALLS = 3
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

METHODS = {
    "otzoo_tf_xla": ("keras", "tensorflow", "otzoo GSP, TensorFlow backend, XLA (jit_compile)"),
    "otzoo_jax_jit": ("keras", "jax", "otzoo GSP, JAX backend, jax.jit"),
    "otzoo_torch_eager": ("keras", "torch", "otzoo GSP, PyTorch backend, eager"),
    "otzoo_torch_eager_1thread": ("keras", "torch:1", "otzoo GSP, PyTorch backend, eager, 1 thread"),
    "ott_lse_implicit": ("ott", "lse_implicit", "OTT-JAX two-column Sinkhorn, log mode, implicit diff, jit"),
    "ott_kernel_implicit": ("ott", "kernel_implicit", "OTT-JAX two-column Sinkhorn, kernel mode, implicit diff, jit"),
    "ott_lse_unrolled": ("ott", "lse_unrolled", "OTT-JAX two-column Sinkhorn, log mode, unrolled, jit"),
    "ott_kernel_unrolled": ("ott", "kernel_unrolled", "OTT-JAX two-column Sinkhorn, kernel mode, unrolled, jit"),
}


def _inputs():
    """``gsp.py``'s layer inputs (same generator, same order of draws): features, loss weights, prototypes."""
    rng = np.random.default_rng(0)
    shape = (SHAPE["batch"], SHAPE["side"], SHAPE["side"], SHAPE["channels"])
    features = rng.uniform(0, 1, size=shape).astype(np.float32)
    weights = rng.normal(size=(SHAPE["batch"], SHAPE["channels"])).astype(np.float32)
    prototypes = rng.uniform(0, 1, size=(SHAPE["prototypes"], SHAPE["channels"])).astype(np.float32)
    return features, weights, prototypes


# --- otzoo's layer on the backend of this process -----------------------------------------------------------------

def _gsp_layer(prototypes, shape, dtype="float32"):
    from ot_layers import GeneralizedSumPooling

    layer = GeneralizedSumPooling(num_prototypes=SHAPE["prototypes"], transport_ratio=TRANSPORT_RATIO,
                                  epsilon=EPSILON, max_iter=ITERATIONS, threshold=0, gradient="implicit",
                                  return_attributes=True, dtype=dtype)
    layer.build(shape)
    layer.prototypes.assign(prototypes.astype(dtype))
    return layer


def _jax_value_and_grad(layer):
    """``jax.jit`` of the loss and its gradient w.r.t. the features and the trainable variables (the prototypes)."""
    import jax
    import jax.numpy as jnp

    def loss(x, trainable, non_trainable, w):
        (pooled, z), _ = layer.stateless_call(trainable, non_trainable, x)
        return jnp.sum(pooled * w) + jnp.sum(z * z)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    trainable = [v.value for v in layer.trainable_variables]
    non_trainable = [v.value for v in layer.non_trainable_variables]
    return lambda x, w: step(x, trainable, non_trainable, w)


def _keras_step(threads=None):
    """A function running one forward+backward of the layer on this process' backend; returns the loss.
    ``threads`` sets PyTorch's intra-op thread count (``torch.set_num_threads``)."""
    import keras

    features, weights, prototypes = _inputs()
    layer = _gsp_layer(prototypes, features.shape)
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        sys.path.insert(0, HERE)
        from gsp import _layer_step  # the TensorFlow sweep's own step (benchmarks/gsp.py), under XLA

        x, w = tf.constant(features), tf.constant(weights)
        step = _layer_step(layer, jit_compile=True)

        def run():
            loss, *_ = [t.numpy() for t in step(x, w)]
            return float(loss)

        return run
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        step = _jax_value_and_grad(layer)
        x, w = jnp.asarray(features), jnp.asarray(weights)

        def run():
            loss, _ = jax.block_until_ready(step(x, w))
            return float(loss)

        return run
    import torch

    if threads:
        torch.set_num_threads(threads)
    x0, w = (keras.ops.convert_to_tensor(t) for t in (features, weights))  # on Keras' device (a GPU's)
    prototypes_value = layer.prototypes.value

    def run():
        x = x0.clone().requires_grad_(True)
        prototypes_value.grad = None
        pooled, z = layer(x)
        loss = torch.sum(pooled * w) + torch.sum(z * z)
        loss.backward()
        return float(loss.detach())  # waits for the queued work on a GPU, backward included

    return run


# --- OTT-JAX ------------------------------------------------------------------------------------------------------

def _ott_partial_transport(lse_mode=True, implicit=True, iterations=ITERATIONS, inner_iterations=OTT_INNER_ITERATIONS,
                           ridge_kernel=OTT_RIDGE_KERNEL):
    """(P2) through OTT-JAX: a batched function ``cost (B, m, n) -> (plan (B, m, n), residual (B, n))``.

    The ``n x 2`` balanced problem of the module docstring (elements against ``transported`` and the dummy
    ``residual``), solved by OTT-JAX's Sinkhorn, then ``pi_kj = q_j softmax_k(-c_kj / eps)``."""
    import jax
    import jax.numpy as jnp
    from ott.geometry import geometry
    from ott.problems.linear import linear_problem
    from ott.solvers.linear import implicit_differentiation, sinkhorn

    solver = sinkhorn.Sinkhorn(lse_mode=lse_mode, threshold=-1.0, min_iterations=iterations,
                               max_iterations=iterations, inner_iterations=inner_iterations,
                               implicit_diff=implicit_differentiation.ImplicitDiff(
                                   solver_kwargs={"ridge_kernel": ridge_kernel}) if implicit else None)

    def solve(cost):
        n = cost.shape[-1]
        logits = -cost / EPSILON
        soft_min = -EPSILON * jax.nn.logsumexp(logits, axis=0)  # -eps log s_j
        columns = jnp.stack([soft_min, jnp.zeros_like(soft_min)], axis=1)  # (n, 2): transported, residual
        a = jnp.full((n,), 1.0 / n, cost.dtype)
        b = jnp.asarray([TRANSPORT_RATIO, 1.0 - TRANSPORT_RATIO], cost.dtype)
        problem = linear_problem.LinearProblem(geometry.Geometry(cost_matrix=columns, epsilon=EPSILON), a, b)
        mass = solver(problem).matrix
        return mass[:, 0] * jax.nn.softmax(logits, axis=0), mass[:, 1]

    return jax.vmap(solve)


def _jnp_layer_cost(features, prototypes):
    """The layer's cost ``||w̄_k - f̄_j||`` (``ū = u / max(1, ||u||)``), ``(B, m, n)``, in ``jax.numpy``."""
    import jax
    import jax.numpy as jnp

    def clip(u):
        return u * jax.lax.rsqrt(jnp.maximum(jnp.sum(u * u, axis=-1, keepdims=True), 1.0))

    f, p = clip(features), clip(prototypes)
    squared = (jnp.sum(p * p, axis=-1)[None, :, None] + jnp.sum(f * f, axis=-1)[:, None, :]
               - 2.0 * jnp.einsum("md,bnd->bmn", p, f))
    return jnp.sqrt(jnp.maximum(squared, 1e-12))


def _ott_loss(lse_mode, implicit, ridge_kernel=OTT_RIDGE_KERNEL):
    """The layer's loss with OTT-JAX's solve: cost, transport, pooling weights, pooled vectors, attributes."""
    import jax.numpy as jnp

    transport = _ott_partial_transport(lse_mode, implicit, ridge_kernel=ridge_kernel)

    def loss(features, prototypes, w):
        flat = features.reshape(features.shape[0], -1, features.shape[-1])
        plan, _ = transport(_jnp_layer_cost(flat, prototypes))
        weights = jnp.sum(plan, axis=1) / TRANSPORT_RATIO
        pooled = jnp.einsum("bn,bnc->bc", weights, flat)
        z = jnp.sum(plan, axis=-1) / TRANSPORT_RATIO
        return jnp.sum(pooled * w) + jnp.sum(z * z)

    return loss


def _ott_step(variant):
    import jax
    import jax.numpy as jnp

    mode, gradient = variant.split("_")
    step = jax.jit(jax.value_and_grad(_ott_loss(mode == "lse", gradient == "implicit"), argnums=(0, 1)))
    features, weights, prototypes = (jnp.asarray(t) for t in _inputs())

    def run():
        loss, _ = jax.block_until_ready(step(features, prototypes, weights))
        return float(loss)

    return run


# --- equivalence checks (JAX backend) -----------------------------------------------------------------------------

def _max_abs(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def _check_float64():
    """Converged float64 solves of small random problems: otzoo vs the two-column OTT-JAX formulation (plans,
    residuals, implicit cost gradients) and vs the naive ``m + 1``-column one."""
    import jax
    import jax.numpy as jnp
    from ott.geometry import geometry
    from ott.problems.linear import linear_problem
    from ott.solvers.linear import sinkhorn

    from ot_layers.solvers import partial_transport

    rng = np.random.default_rng(1)
    batch, m, n = 4, 7, 30
    cost = rng.uniform(0, 2, size=(batch, m, n))
    probe_plan, probe_residual = rng.normal(size=(batch, m, n)), rng.normal(size=(batch, n))

    def otzoo(c, max_iter, threshold):
        result = partial_transport(c, TRANSPORT_RATIO, epsilon=EPSILON, max_iter=max_iter, threshold=threshold)
        return result.plan, result.residual, result.iterations

    def probe(solve):
        def value(c):
            plan, residual = solve(c)[:2]
            return jnp.sum(plan * probe_plan) + jnp.sum(residual * probe_residual)

        return jax.grad(value)(jnp.asarray(cost))

    reference = otzoo(cost, 5000, 1e-14)
    converged = _ott_partial_transport(iterations=2000, inner_iterations=10)
    plan, residual = converged(jnp.asarray(cost))
    otzoo_grad = probe(lambda c: otzoo(c, 5000, 1e-14))
    ott_grad = probe(converged)
    ott_unrolled_grad = probe(_ott_partial_transport(implicit=False, iterations=2000, inner_iterations=10))
    at_50_otzoo = otzoo(cost, ITERATIONS, 0.0)
    at_50_ott = _ott_partial_transport()(jnp.asarray(cost))

    # The naive formulation: n elements against m prototypes of mass mu/m each plus a zero-cost dummy of 1 - mu.
    def naive(c):
        columns = jnp.concatenate([c.T, jnp.zeros((n, 1), c.dtype)], axis=1)
        b = jnp.concatenate([jnp.full((m,), TRANSPORT_RATIO / m), jnp.asarray([1.0 - TRANSPORT_RATIO])])
        problem = linear_problem.LinearProblem(geometry.Geometry(cost_matrix=columns, epsilon=EPSILON),
                                               jnp.full((n,), 1.0 / n), b)
        out = sinkhorn.Sinkhorn(threshold=1e-12, max_iterations=5000)(problem)
        return out.matrix[:, :m].T

    naive_plan = jax.vmap(naive)(jnp.asarray(cost))
    return {
        "problems": f"{batch} random costs U(0, 2) of {m} prototypes x {n} elements, float64",
        "otzoo_iterations_to_1e-14": np.asarray(reference[2]).tolist(),
        "max_plan_entry": float(np.max(reference[0])),
        "max_abs_plan_difference": _max_abs(plan, reference[0]),
        "max_abs_residual_difference": _max_abs(residual, reference[1]),
        "implicit_cost_gradient_relative_difference": _relative(ott_grad, otzoo_grad),
        "ott_unrolled_cost_gradient_relative_difference": _relative(ott_unrolled_grad, otzoo_grad),
        "at_50_iterations_max_abs_plan_difference": _max_abs(at_50_ott[0], at_50_otzoo[0]),
        "naive_m_plus_1_columns_max_abs_plan_difference": _max_abs(naive_plan, reference[0]),
    }


def _check_float32():
    """The benchmark's own problem in float32 at 50 iterations: plans of otzoo and OTT-JAX on the same cost, and the
    loss and gradients of the timed otzoo (JAX backend) and OTT-JAX functions."""
    import jax
    import jax.numpy as jnp

    from ot_layers.solvers import partial_transport

    features, weights, prototypes = _inputs()
    flat = features.reshape(features.shape[0], -1, features.shape[-1])
    cost = _jnp_layer_cost(jnp.asarray(flat), jnp.asarray(prototypes))
    otzoo_plan = partial_transport(cost, TRANSPORT_RATIO, epsilon=EPSILON, max_iter=ITERATIONS, threshold=0).plan
    report = {"max_plan_entry": float(np.max(otzoo_plan))}
    for variant in ("lse", "kernel"):
        plan, _ = jax.jit(_ott_partial_transport(lse_mode=variant == "lse"))(cost)
        report[f"ott_{variant}_max_abs_plan_difference"] = _max_abs(plan, otzoo_plan)
    inputs = (jnp.asarray(features), jnp.asarray(prototypes), jnp.asarray(weights))
    try:  # OTT-JAX's default implicit differentiation (no ridge) on the timed loss
        _, gradients = jax.jit(jax.value_and_grad(_ott_loss(True, True, ridge_kernel=0.0), argnums=(0, 1)))(*inputs)
        finite = all(bool(jnp.all(jnp.isfinite(g))) for g in gradients)
        report["ott_lse_implicit_without_ridge"] = "finite" if finite else "non-finite"
    except RuntimeError as error:  # lineax raises (through JAX's callback) when its solve is not finite
        reason = "linear solve returned non-finite output" if "non-finite" in str(error) else type(error).__name__
        report["ott_lse_implicit_without_ridge"] = f"fails: {reason}"
    otzoo_loss, (otzoo_gx, (otzoo_gp,)) = _jax_value_and_grad(_gsp_layer(prototypes, features.shape))(
        jnp.asarray(features), jnp.asarray(weights))
    for name in METHODS:
        if not name.startswith("ott"):
            continue
        mode, gradient = name.split("_")[1:]
        step = jax.jit(jax.value_and_grad(_ott_loss(mode == "lse", gradient == "implicit"), argnums=(0, 1)))
        loss, (gx, gp) = step(*inputs)
        report[f"{name}_loss_relative_difference"] = abs(float(loss) - float(otzoo_loss)) / abs(float(otzoo_loss))
        report[f"{name}_feature_gradient_relative_difference"] = _relative(gx, otzoo_gx)
        report[f"{name}_prototype_gradient_relative_difference"] = _relative(gp, otzoo_gp)
    return report


# --- processes ----------------------------------------------------------------------------------------------------

def _emit(message):
    print("@@" + json.dumps(message), flush=True)


def _serve(run, info):
    """Worker loop: warm up, report ready (with the loss), then one timed step per ``run`` line on stdin."""
    for _ in range(WARMUP_CALLS):
        loss = run()
    _emit(dict(info, ready=True, loss=loss))
    for line in sys.stdin:
        if line.strip() != "run":
            break
        start = time.perf_counter()
        run()
        _emit({"seconds": time.perf_counter() - start})


class _Worker:
    def __init__(self, name, argv, env):
        self.name = name
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, env=env, cwd=ROOT)

    def read(self):
        for line in self.proc.stdout:
            if line.startswith("@@"):
                return json.loads(line[2:])
        self.proc.wait()
        self.stderr.seek(0)
        tail = self.stderr.read().strip().splitlines()
        raise RuntimeError(f"{self.name} exited ({self.proc.returncode}): {tail[-1] if tail else '?'}")

    def step(self):
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self.read()["seconds"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        self.stderr.close()


def _worker_argv(*args):
    return [sys.executable, os.path.abspath(__file__), "--worker", *args]


def _run_check(kind):
    extra = {"KERAS_BACKEND": "jax"}
    if kind == "float64":
        extra["JAX_ENABLE_X64"] = "1"
    worker = _Worker(f"check {kind}", _worker_argv("check", kind), accelerator.worker_env(**extra))
    try:
        return worker.read()
    except RuntimeError as error:
        return {"skipped": str(error)}
    finally:
        worker.close()


def time_methods(repeats):
    """``{method: result}``: every method in its own process, timed in interleaved, rotated rounds."""
    workers, results = {}, {}
    for name, (kind, arg, label) in METHODS.items():
        env = accelerator.worker_env(KERAS_BACKEND=arg.split(":")[0] if kind == "keras" else "jax")
        workers[name] = _Worker(name, _worker_argv(kind, arg), env)
        results[name] = {"label": label}
    for name, worker in list(workers.items()):
        try:
            ready = worker.read()
            results[name].update(loss=ready["loss"], versions=ready["versions"], device=ready["device"])
        except RuntimeError as error:
            results[name]["skipped"] = str(error)
            worker.close()
            del workers[name]
    times = {name: [] for name in workers}
    names = list(workers)
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(workers[name].step())
    for name, worker in workers.items():
        worker.close()
        results[name].update(median_ms=1e3 * statistics.median(times[name]), min_ms=1e3 * min(times[name]),
                             times_ms=[1e3 * t for t in times[name]])
    return results


def _versions():
    from importlib import metadata

    found = {}
    for package in ("keras", "tensorflow", "jax", "torch", "ott-jax"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    return found


def _ratios(results):
    timed = {name: r for name, r in results.items() if "median_ms" in r}
    ratios = {}
    ott = [name for name in timed if name.startswith("ott")]
    if ott:
        best = min(ott, key=lambda name: timed[name]["median_ms"])
        ratios["best_ott"] = best
        for name in timed:
            if not name.startswith("ott"):
                ratios[f"{name}_speedup_vs_best_ott_median"] = timed[best]["median_ms"] / timed[name]["median_ms"]
                ratios[f"{name}_speedup_vs_best_ott_min"] = timed[best]["min_ms"] / timed[name]["min_ms"]
        implicit = "ott_lse_implicit"
        if implicit in timed and "otzoo_jax_jit" in timed:  # both on JAX, both with the implicit gradient
            ratios["otzoo_jax_jit_speedup_vs_ott_lse_implicit_median"] = (
                timed[implicit]["median_ms"] / timed["otzoo_jax_jit"]["median_ms"])
    if "otzoo_tf_xla" in timed:
        base = timed["otzoo_tf_xla"]
        for name in timed:
            if name != "otzoo_tf_xla":
                ratios[f"{name}_time_over_tf_xla_median"] = timed[name]["median_ms"] / base["median_ms"]
                ratios[f"{name}_time_over_tf_xla_min"] = timed[name]["min_ms"] / base["min_ms"]
        losses = [r["loss"] for r in timed.values()]
        ratios["max_loss_relative_spread"] = (max(losses) - min(losses)) / abs(base["loss"])
    return ratios


def _plan_summary(checks):
    """The plan agreement of the OTT-JAX formulation with otzoo (max |difference|, and over the largest entry)."""
    summary = {}
    f64, f32 = checks["float64_converged"], checks["float32_benchmark_problem"]
    if "max_abs_plan_difference" in f64:
        summary["float64_converged_abs"] = f64["max_abs_plan_difference"]
        summary["float64_converged_relative_to_max_entry"] = f64["max_abs_plan_difference"] / f64["max_plan_entry"]
        summary["float64_naive_m_plus_1_columns_abs"] = f64["naive_m_plus_1_columns_max_abs_plan_difference"]
        summary["float64_implicit_gradient_relative"] = f64["implicit_cost_gradient_relative_difference"]
    if "max_plan_entry" in f32:
        worst = max(f32["ott_lse_max_abs_plan_difference"], f32["ott_kernel_max_abs_plan_difference"])
        summary["float32_benchmark_50_iterations_abs"] = worst
        summary["float32_benchmark_50_iterations_relative_to_max_entry"] = worst / f32["max_plan_entry"]
        summary["float32_worst_gradient_relative"] = max(
            value for key, value in f32.items() if key.endswith("gradient_relative_difference"))
    for name, check in checks.items():
        if "skipped" in check:
            summary[name] = check["skipped"]
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_count, default=10)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "gsp_backends.json"))
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        kind, arg = args.worker
        if kind == "check":
            _emit(_check_float64() if arg == "float64" else _check_float32())
        else:
            threads = int(arg.split(":")[1]) if ":" in arg else None
            run = _keras_step(threads) if kind == "keras" else _ott_step(arg)
            _serve(run, {"versions": _versions(), "device": accelerator.device_name()})
        return

    load_before = os.getloadavg()
    checks = {"float64_converged": _run_check("float64"), "float32_benchmark_problem": _run_check("float32")}
    results = time_methods(args.repeats)
    ratios = _ratios(results)
    report = {"shape": SHAPE, "transport_ratio": TRANSPORT_RATIO, "epsilon": EPSILON, "iterations": ITERATIONS,
              "threshold": 0.0, "gradient": "implicit (otzoo); OTT-JAX implicit and unrolled",
              "ott_inner_iterations": OTT_INNER_ITERATIONS, "repeats": args.repeats, "warmup_calls": WARMUP_CALLS,
              "cpu_count": os.cpu_count(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "platform": platform.platform(),
              "devices": accelerator.devices_in(results), "results": results, "ratios": ratios,
              "max_plan_difference": _plan_summary(checks), "plan_check": checks}
    write_json(args.out, report)

    print(f"\n{'method':<64}{'median ms':>10}{'min ms':>9}{'/ TF XLA':>10}{'loss':>14}")
    for name, result in results.items():
        if "median_ms" not in result:
            print(f"{result['label']:<64}  skipped: {result['skipped']}")
            continue
        # "-" where TensorFlow did not run (the GPU machine has none); TensorFlow's own row is 1 by definition.
        over_tf = ratios.get(f"{name}_time_over_tf_xla_median", 1.0 if name == "otzoo_tf_xla" else None)
        over_tf = "-" if over_tf is None else f"{over_tf:.2f}"
        print(f"{result['label']:<64}{result['median_ms']:>10.1f}{result['min_ms']:>9.1f}{over_tf:>10}"
              f"{result['loss']:>14.6g}")
    for name, value in ratios.items():
        print(f"{name}: {value:.3g}" if isinstance(value, float) else f"{name}: {value}")
    for name, value in report["max_plan_difference"].items():
        print(f"plan check, {name}: {value:.3g}" if isinstance(value, float) else f"plan check, {name}: {value}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
