"""Speed and memory of the Multi-Proxy Wasserstein head computation against peers, measured in one run.

The computation: B=64 feature maps of n=64 elements (d=64) against K=100 classes of M=4 proxies,
cosine cost, epsilon=0.1, 20 Sinkhorn iterations with the convergence check off, logits = plan-weighted inner
products; forward + backward (gradients for features and proxies). Peers:
  (a) naive: a straightforward unrolled log-domain TensorFlow Sinkhorn, autodiff, under XLA;
  (b) pot: POT's ``ot.sinkhorn`` in a Python loop over the 6,400 problems (forward only);
  (c) ott: OTT-JAX's Sinkhorn vmapped over the batch, jit-compiled, forward + backward by unrolling (its implicit
      differentiation fails with NaN after 20 iterations, away from the fixed point); only where ``ott-jax``
      imports, in this interpreter or in the one named by ``$OTZOO_JAX_PYTHON``.
otzoo's own head also runs on Keras' JAX backend (``jax.jit`` of value and gradient) and PyTorch backend (eager), each
in its own subprocess with ``KERAS_BACKEND`` set, beside OTT-JAX in the same run.
The TensorFlow methods run in one subprocess, timed in interleaved rounds (median of the rounds after compilation)
with their peak memory taken from TensorFlow's BFC allocator; POT and OTT-JAX run in their own subprocesses, with
memory as the growth of the peak resident set size (for OTT-JAX including its compilation).

    python benchmarks/sinkhorn.py [--repeats 10] [--out benchmarks/results/sinkhorn.json]

Where TensorFlow is not installed (the GPU machine), the TensorFlow methods are reported as skipped and the ratios
left are the JAX backend's against OTT-JAX and PyTorch's against JAX; on a GPU, otzoo's JAX and PyTorch workers and
OTT-JAX run on the GPU (each result names its ``device``) and memory is the framework allocator's peak.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

import accelerator  # benchmarks/accelerator.py (imports no framework until called)
from report import positive_count, write_json

SHAPE = dict(batch=64, classes=100, elements=64, proxies=4, dim=64)
EPSILON = 0.1
ITERATIONS = 20
HERE = os.path.dirname(os.path.abspath(__file__))


def _inputs():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(SHAPE["batch"], SHAPE["elements"], SHAPE["dim"])).astype(np.float32)
    proxies = rng.normal(size=(SHAPE["classes"], SHAPE["proxies"], SHAPE["dim"])).astype(np.float32)
    return features, proxies


def _rss_mb():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _summary(times, peak_mem_mb, memory_source):
    return {"median_ms": 1000 * statistics.median(times), "min_ms": 1000 * min(times),
            "peak_mem_mb": peak_mem_mb, "memory_source": memory_source}


def _time_tf_interleaved(steps, repeats):
    """Times TensorFlow steps in interleaved rounds (one call of each per round), so that the load of other
    processes affects all alike; memory is the BFC allocator's peak over its level before the call."""
    import tensorflow as tf

    for step in steps.values():
        step()  # compile / warm up
    times = {name: [] for name in steps}
    peaks = {name: 0.0 for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            tf.config.experimental.reset_memory_stats("CPU:0")
            baseline = tf.config.experimental.get_memory_info("CPU:0")["current"]
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
            peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - baseline
            peaks[name] = max(peaks[name], peak / 2**20)
    return {name: _summary(times[name], peaks[name], "TF BFC allocator peak") for name in steps}


def _time_python(step, repeats):
    baseline = _rss_mb()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return _summary(times, _peak_rss_mb() - baseline, "peak RSS growth")


def _time_keras(step, repeats):
    """:func:`_time_python` for otzoo's head on the JAX or PyTorch backend, with the device it ran on; on a GPU the
    memory is the framework allocator's peak (the resident set size does not see device memory)."""
    accelerator.reset_peak_memory()
    result = dict(_time_python(step, repeats), device=accelerator.device_name())
    gpu_peak = accelerator.peak_memory_mb()
    if gpu_peak is not None:
        result.update(peak_mem_mb=gpu_peak, memory_source="device allocator peak")
    return result


# --- TensorFlow methods ------------------------------------------------------------------------------------------

def _tf_step(method):
    import tensorflow as tf

    features, proxies = (tf.constant(t) for t in _inputs())
    if method.startswith("otzoo"):
        from ot_layers.layers.sinkhorn_match import SinkhornMatch

        gradient = "unrolled" if "unrolled" in method else "implicit"
        matcher = SinkhornMatch(epsilon=EPSILON, max_iter=ITERATIONS, threshold=0.0, gradient=gradient)

        def logits_fn(x, p):
            plan, inner, _ = matcher.match(x, p)
            return tf.reduce_sum(plan * inner, axis=[-2, -1])
    else:
        def logits_fn(x, p):
            inner = tf.einsum("bnd,kmd->bknm", x, p)
            cost = 1.0 - tf.einsum("bnd,kmd->bknm", tf.math.l2_normalize(x, -1), tf.math.l2_normalize(p, -1))
            log_a = -tf.math.log(float(SHAPE["elements"]))
            log_b = -tf.math.log(float(SHAPE["proxies"]))
            f = tf.zeros(tf.shape(cost)[:-1])
            g = tf.zeros(tf.concat([tf.shape(cost)[:-2], tf.shape(cost)[-1:]], 0))
            for _ in range(ITERATIONS):
                f = EPSILON * (log_a - tf.reduce_logsumexp((g[..., None, :] - cost) / EPSILON, axis=-1))
                g = EPSILON * (log_b - tf.reduce_logsumexp((f[..., :, None] - cost) / EPSILON, axis=-2))
            plan = tf.exp((f[..., :, None] + g[..., None, :] - cost) / EPSILON)
            return tf.reduce_sum(plan * inner, axis=[-2, -1])

    jit = not method.endswith("graph")

    @tf.function(jit_compile=jit)
    def step(x, p):
        with tf.GradientTape() as tape:
            tape.watch([x, p])
            loss = tf.reduce_sum(logits_fn(x, p))
        return loss, tape.gradient(loss, [x, p])

    return lambda: [t.numpy() for t in tf.nest.flatten(step(features, proxies))]


def _keras_step():
    """otzoo's head, forward + backward, on the backend the process was started with (``KERAS_BACKEND``)."""
    import keras
    from keras import ops

    from ot_layers.layers.sinkhorn_match import SinkhornMatch

    matcher = SinkhornMatch(epsilon=EPSILON, max_iter=ITERATIONS, threshold=0.0, gradient="implicit")

    def loss(x, p):
        plan, inner, _ = matcher.match(x, p)
        return ops.sum(plan * inner)

    features, proxies = (ops.convert_to_tensor(t) for t in _inputs())
    if keras.backend.backend() == "jax":
        import jax

        compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
        return lambda: jax.block_until_ready(compiled(features, proxies))
    def step():
        x, p = (t.detach().clone().requires_grad_(True) for t in (features, proxies))
        loss(x, p).backward()
        accelerator.synchronize()  # on a GPU, backward returns before its kernels have run
        return x.grad, p.grad

    return step


def _pot_step():
    import ot

    features, proxies = _inputs()
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    cost = 1.0 - np.einsum("bnd,kmd->bknm", unit(features), unit(proxies)).astype(np.float64)
    a = np.full(SHAPE["elements"], 1.0 / SHAPE["elements"])
    b = np.full(SHAPE["proxies"], 1.0 / SHAPE["proxies"])

    def step():
        for i in range(SHAPE["batch"]):
            for k in range(SHAPE["classes"]):
                ot.sinkhorn(a, b, cost[i, k], EPSILON, numItermax=ITERATIONS, stopThr=0.0)

    return step


_OTT_SCRIPT = r"""
import json, os, resource, statistics, sys, time
import numpy as np
import jax, jax.numpy as jnp
from ott.geometry import geometry
from ott.problems.linear import linear_problem
from ott.solvers.linear import sinkhorn as ott_sinkhorn
cfg = json.loads(sys.argv[1])
rng = np.random.default_rng(0)
x = jnp.asarray(rng.normal(size=(cfg["batch"], cfg["elements"], cfg["dim"])).astype(np.float32))
p = jnp.asarray(rng.normal(size=(cfg["classes"], cfg["proxies"], cfg["dim"])).astype(np.float32))
solver = ott_sinkhorn.Sinkhorn(min_iterations=cfg["iterations"], max_iterations=cfg["iterations"],
                               threshold=-1.0, inner_iterations=1, lse_mode=cfg["lse_mode"],
                               implicit_diff=None)  # its implicit solve returns NaN away from the fixed point
def plan(cost):
    problem = linear_problem.LinearProblem(geometry.Geometry(cost_matrix=cost, epsilon=cfg["epsilon"]))
    return solver(problem).matrix
def logits(x, p):
    inner = jnp.einsum("bnd,kmd->bknm", x, p)
    unit = lambda v: v / jnp.linalg.norm(v, axis=-1, keepdims=True)
    cost = 1.0 - jnp.einsum("bnd,kmd->bknm", unit(x), unit(p))
    plans = jax.vmap(jax.vmap(plan))(cost)
    return jnp.sum(plans * inner, axis=(-2, -1))
step = jax.jit(jax.value_and_grad(lambda x, p: jnp.sum(logits(x, p)), argnums=(0, 1)))
def run():
    v, g = step(x, p); jax.block_until_ready(g)
def rss():
    with open("/proc/self/statm") as h: return int(h.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
base = rss()
run()
times = []
for _ in range(cfg["repeats"]):
    t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
peak, source = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base, "peak RSS growth (includes compilation)"
device = jax.devices()[0]
stats = (device.memory_stats() or {}) if device.platform != "cpu" else {}
if "peak_bytes_in_use" in stats:
    peak, source = stats["peak_bytes_in_use"] / 2**20, "device allocator peak"
print(json.dumps({"median_ms": 1000 * statistics.median(times), "min_ms": 1000 * min(times), "peak_mem_mb": peak,
                  "memory_source": source, "ott_version": __import__("ott").__version__,
                  "device": "cpu" if device.platform == "cpu" else device.device_kind}))
"""


def _jax_python():
    candidates = [os.environ.get("OTZOO_JAX_PYTHON"), sys.executable]
    for python in candidates:
        if python and subprocess.run([python, "-c", "import ott"], capture_output=True).returncode == 0:
            return python
    return None


TF_METHODS = {
    "otzoo_xla": "otzoo (kernel domain, implicit gradient), XLA",
    "otzoo_graph": "otzoo (kernel domain, implicit gradient), graph mode",
    "otzoo_unrolled_xla": "otzoo (kernel domain, unrolled autodiff), XLA",
    "naive_xla": "(a) naive unrolled log-domain TF, XLA",
}
OTHER_METHODS = {
    "otzoo_jax": "otzoo (kernel domain, implicit gradient), Keras JAX backend, jit",
    "otzoo_torch": "otzoo (kernel domain, implicit gradient), Keras PyTorch backend, eager",
    "pot": "(b) POT per-problem loop (forward only)",
    "ott_kernel": "(c) OTT-JAX vmapped, kernel mode, jit",
    "ott_lse": "(c) OTT-JAX vmapped, log mode, jit",
}


def _run_json(cmd, **env_vars):
    env = accelerator.worker_env(TF_CPU_ALLOCATOR_USE_BFC="true", **env_vars)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "?"
        return {"skipped": f"failed: {last}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_peer(method, repeats):
    """Runs POT or OTT-JAX in a subprocess and returns its measurement (or a dict with ``skipped``)."""
    if method == "pot":
        return _run_json([sys.executable, os.path.abspath(__file__), "--worker", "pot", "--repeats", str(repeats)])
    if method in ("otzoo_jax", "otzoo_torch"):
        backend = method.split("_")[1]
        return _run_json([sys.executable, os.path.abspath(__file__), "--worker", "keras", "--repeats", str(repeats)],
                         KERAS_BACKEND="jax" if backend == "jax" else "torch")
    python = _jax_python()
    if python is None:
        return {"skipped": "ott-jax not installed (set OTZOO_JAX_PYTHON to an interpreter that has it)"}
    cfg = dict(SHAPE, epsilon=EPSILON, iterations=ITERATIONS, repeats=repeats, lse_mode=method == "ott_lse")
    return _run_json([python, "-c", _OTT_SCRIPT, json.dumps(cfg)])


def _ratios(results):
    """Speed ratios (of medians: each peer's own timing conditions differ, see the docstring) and the targets. Where
    TensorFlow is missing (a GPU machine without it), the TensorFlow ratios and targets are left out."""
    timed = {name: r["median_ms"] for name, r in results.items() if "median_ms" in r}
    ratios, targets = {}, {}
    ours = timed.get("otzoo_xla")
    ott = min((timed[m] for m in ("ott_kernel", "ott_lse") if m in timed), default=None)
    if ours is not None:
        for peer, need in (("naive_xla", 8.0), ("pot", 100.0)):
            if peer in timed:
                ratios[f"speedup_vs_{peer}"] = timed[peer] / ours
                targets[f"at_least_{need:g}x_faster_than_{peer}"] = ratios[f"speedup_vs_{peer}"] >= need
        if ott is not None:
            ratios["speedup_vs_best_ott"] = ott / ours
            targets["not_slower_than_ott"] = ratios["speedup_vs_best_ott"] >= 1.0
        for backend in ("jax", "torch"):
            if f"otzoo_{backend}" in timed:
                ratios[f"{backend}_backend_time_over_tf_xla"] = timed[f"otzoo_{backend}"] / ours
    if ott is not None and "otzoo_jax" in timed:  # the same library's solver, both on JAX
        ratios["jax_backend_speedup_vs_best_ott"] = ott / timed["otzoo_jax"]
    if "otzoo_jax" in timed and "otzoo_torch" in timed:
        ratios["torch_backend_time_over_jax_backend"] = timed["otzoo_torch"] / timed["otzoo_jax"]
    return ratios, targets


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=positive_count, default=10)
    parser.add_argument("--pot-repeats", type=positive_count, default=1)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "sinkhorn.json"))
    parser.add_argument("--worker", choices=["tf", "pot", "keras"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker == "tf":
        print(json.dumps(_time_tf_interleaved({m: _tf_step(m) for m in TF_METHODS}, args.repeats)))
        return
    if args.worker == "pot":
        print(json.dumps(_time_python(_pot_step(), args.repeats)))
        return
    if args.worker == "keras":
        step = _keras_step()
        step()  # compile / warm up
        print(json.dumps(_time_keras(step, args.repeats)))
        return

    load_before = os.getloadavg()  # the other processes' load: the timings carry it
    tf_results = _run_json([sys.executable, os.path.abspath(__file__), "--worker", "tf", "--repeats",
                            str(args.repeats)])
    results = {m: dict(tf_results.get(m, tf_results), label=label) for m, label in TF_METHODS.items()}
    for method, label in OTHER_METHODS.items():
        repeats = args.pot_repeats if method == "pot" else args.repeats
        results[method] = dict(run_peer(method, repeats), label=label)
    for method, result in results.items():
        print(f"{method:>20}: {result}", flush=True)

    ratios, targets = _ratios(results)
    devices = accelerator.devices_in(results)
    report = {"shape": SHAPE, "epsilon": EPSILON, "iterations": ITERATIONS, "repeats": args.repeats,
              "pot_repeats": args.pot_repeats, "results": results,
              "ratios": ratios, "targets": targets, "cpu_count": os.cpu_count(), "devices": devices,
              "load_average_before": load_before, "load_average_after": os.getloadavg()}
    write_json(args.out, report)

    print(f"\n{'method':<52}{'median ms':>12}{'peak MB':>10}")
    for method, result in results.items():
        if "median_ms" in result:
            print(f"{result['label']:<52}{result['median_ms']:>12.1f}{result['peak_mem_mb']:>10.1f}")
        else:
            print(f"{result['label']:<52}  skipped: {result['skipped']}")
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x")
    for name, held in targets.items():
        print(f"target {name}: {'holds' if held else 'does NOT hold'}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
