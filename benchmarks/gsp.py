"""GSP forward+backward cost against the solver's iteration count: implicit gradient vs unrolled autodiff.

One run measures, for 10, 25, 50, 100 and 200 evaluations of the solver (``threshold=0``: a fixed count; the layer
finds Prop. 5.2.1's fixed point by Newton's method, the solver rows by ``--method``, Newton's by default; at the
default threshold either stops far earlier, see ``benchmarks/gsp_methods.py``), the time of a forward+backward pass and
its peak allocator memory, with the implicit gradient (Prop. 5.2.2) and with autodiff through the iterations, in
graph mode and under XLA, for two workloads: ``layer``, the whole ``GeneralizedSumPooling`` (cost from features
and prototypes, solve, pooling; gradients w.r.t. the feature map and the prototypes), and ``solver``,
``partial_transport`` alone on a given cost (gradient w.r.t. the cost), where the iterations are all the work.
Times are the median and the minimum of ``--repeats`` calls, taken in interleaved rounds (each round calls every
configuration of a workload once), so that the load of other processes on a shared machine affects all of them
alike; the target is judged on the minimum.
Also times ``training.evaluation.retrieval_metrics`` on 10k embeddings. Prints a table and writes
``benchmarks/results/gsp.json``. Peak memory uses TensorFlow's BFC allocator on CPU (set before TF starts).

    python benchmarks/gsp.py [--batch 64 --side 14 --channels 128 --prototypes 64 --repeats 30]

The recorded run (docs/results/gsp.md) is ``python benchmarks/gsp.py --repeats 100``.
"""
import argparse
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from ot_layers import GeneralizedSumPooling  # noqa: E402
from ot_layers.solvers import partial_transport  # noqa: E402
from ot_layers.solvers.partial_transport import METHODS  # noqa: E402
from training.evaluation.retrieval import retrieval_metrics
from report import positive_count, write_json

ITERATIONS = (10, 25, 50, 100, 200)
TARGET_RATIO = 1.2  # implicit gradient, XLA: time(100 iterations) / time(10 iterations)


def _layer_step(layer, jit_compile):
    @tf.function(jit_compile=jit_compile)
    def step(features, weights):
        with tf.GradientTape() as tape:
            tape.watch(features)
            pooled, z = layer(features)
            loss = tf.reduce_sum(pooled * weights) + tf.reduce_sum(tf.square(z))
        grad_features, grad_prototypes = tape.gradient(loss, [features, layer.prototypes])
        return loss, grad_features, grad_prototypes

    return step


def _solver_step(iterations, gradient, jit_compile, method):
    @tf.function(jit_compile=jit_compile)
    def step(cost, weights):
        with tf.GradientTape() as tape:
            tape.watch(cost)
            result = partial_transport(cost, 0.3, epsilon=0.2, max_iter=iterations, threshold=0, gradient=gradient,
                                       method=method)
            loss = tf.reduce_sum(result.residual * weights) + tf.reduce_sum(tf.square(result.plan))
        return loss, tape.gradient(loss, cost)

    return step


def _time_interleaved(configs, repeats):
    """``{key: (median_ms, min_ms)}`` for ``configs`` ``[(key, step, inputs)]`` timed round-robin."""
    for _, step, inputs in configs:
        for _ in range(3):
            step(*inputs)[0].numpy()
    times = {key: [] for key, _, _ in configs}
    for _ in range(repeats):
        for key, step, inputs in configs:
            start = time.perf_counter()
            step(*inputs)[0].numpy()
            times[key].append(time.perf_counter() - start)
    return {key: (1e3 * float(np.median(t)), 1e3 * float(np.min(t))) for key, t in times.items()}


def _peak_bytes(step, *inputs):
    tf.config.experimental.reset_memory_stats("CPU:0")
    baseline = tf.config.experimental.get_memory_info("CPU:0")["current"]
    outputs = step(*inputs)
    _ = [o.numpy() for o in outputs]
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - baseline


def measure(args):
    rng = np.random.default_rng(0)
    shape = (args.batch, args.side, args.side, args.channels)
    features = tf.constant(rng.uniform(0, 1, size=shape).astype(np.float32))
    feature_weights = tf.constant(rng.normal(size=(args.batch, args.channels)).astype(np.float32))
    prototypes = rng.uniform(0, 1, size=(args.prototypes, args.channels)).astype(np.float32)
    n = args.side * args.side
    cost = tf.constant(rng.uniform(0, 2, size=(args.batch, args.prototypes, n)).astype(np.float32))
    residual_weights = tf.constant(rng.normal(size=(args.batch, n)).astype(np.float32))
    rows = []
    for workload in ("layer", "solver"):
        configs = []
        for compiler in ("graph", "xla"):
            for gradient in ("implicit", "unrolled"):
                for iterations in ITERATIONS:
                    if workload == "layer":
                        layer = GeneralizedSumPooling(num_prototypes=args.prototypes, max_iter=iterations,
                                                      threshold=0, gradient=gradient, return_attributes=True)
                        layer.build(shape)
                        layer.prototypes.assign(prototypes)
                        step, inputs = _layer_step(layer, compiler == "xla"), (features, feature_weights)
                    else:
                        step = _solver_step(iterations, gradient, compiler == "xla", args.method)
                        inputs = (cost, residual_weights)
                    configs.append(((workload, compiler, gradient, iterations), step, inputs))
        timings = _time_interleaved(configs, args.repeats)
        for key, step, inputs in configs:
            median_ms, min_ms = timings[key]
            row = dict(zip(("workload", "compiler", "gradient", "iterations"), key),
                       median_ms=median_ms, min_ms=min_ms, peak_mib=_peak_bytes(step, *inputs) / 2**20)
            rows.append(row)
            print(f"{key[0]:6s} {key[1]:5s} {key[2]:11s} {key[3]:4d} it  median {median_ms:8.2f} ms"
                  f"  min {min_ms:8.2f} ms  peak {row['peak_mib']:7.2f} MiB", flush=True)
    return rows


def _lookup(rows, workload, compiler, gradient, iterations):
    key = (workload, compiler, gradient, iterations)
    return next(r for r in rows if (r["workload"], r["compiler"], r["gradient"], r["iterations"]) == key)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--side", type=int, default=14)
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--prototypes", type=int, default=64)
    parser.add_argument("--repeats", type=positive_count, default=30)
    parser.add_argument("--method", choices=METHODS, default="newton",
                        help="the solver's method for the solver rows (the layer always uses the default, newton)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gsp.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()  # the other processes' load: the timings carry it

    rows = measure(args)
    summary = {}
    for workload in ("layer", "solver"):
        for compiler in ("graph", "xla"):
            for gradient in ("implicit", "unrolled"):
                base = _lookup(rows, workload, compiler, gradient, 10)
                for iterations in (100, 200):
                    row = _lookup(rows, workload, compiler, gradient, iterations)
                    prefix = f"{workload}_{compiler}_{gradient}"
                    summary[f"{prefix}_min_time_ratio_{iterations}_vs_10"] = row["min_ms"] / base["min_ms"]
                    summary[f"{prefix}_median_time_ratio_{iterations}_vs_10"] = row["median_ms"] / base["median_ms"]
                    summary[f"{prefix}_peak_ratio_{iterations}_vs_10"] = row["peak_mib"] / base["peak_mib"]
            closed = _lookup(rows, workload, compiler, "implicit", 100)
            auto = _lookup(rows, workload, compiler, "unrolled", 100)
            summary[f"{workload}_{compiler}_unrolled_over_implicit_min_time_at_100"] = (
                auto["min_ms"] / closed["min_ms"])
            summary[f"{workload}_{compiler}_unrolled_over_implicit_peak_at_100"] = (
                auto["peak_mib"] / closed["peak_mib"])
    ratio = summary["layer_xla_implicit_min_time_ratio_100_vs_10"]
    summary["target"] = f"layer, implicit gradient, XLA: min time(100 it) <= {TARGET_RATIO} x min time(10 it)"
    summary["target_holds"] = bool(ratio <= TARGET_RATIO)

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, size=10_000)
    embeddings = rng.normal(size=(5, 128))[labels] + 2.0 * rng.normal(size=(10_000, 128))
    start = time.perf_counter()
    retrieval_metrics(embeddings, labels)
    summary["retrieval_metrics_10k_seconds"] = time.perf_counter() - start

    print("\nsummary")
    for key, value in summary.items():
        print(f"  {key}: {value:.3f}" if isinstance(value, float) else f"  {key}: {value}")
    write_json(args.out, {"config": vars(args), "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                                             "tensorflow": tf.__version__,
                                                             "load_average_before": load_before,
                                                             "load_average_after": os.getloadavg()},
                          "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
