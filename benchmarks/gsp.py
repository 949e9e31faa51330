"""GSP forward+backward cost against the solver's iteration count: closed-form gradient vs autodiff.

One run measures, for 10, 25, 50, 100 and 200 iterations of Prop. 5.2.1, the time of a forward+backward pass of
``GeneralizedSumPooling`` (gradients w.r.t. the feature map and the prototypes) and its peak allocator memory, with
the closed-form gradient (Prop. 5.2.2) and with autodiff through the iterations, in graph mode and under XLA.
Also times ``training.evaluation.retrieval_metrics`` on 10k embeddings. Prints a table and writes
``benchmarks/results/gsp.json``. Peak memory uses TensorFlow's BFC allocator on CPU (set before TF starts).

    python benchmarks/gsp.py [--batch 64 --side 14 --channels 128 --prototypes 64 --repeats 20]
"""
import argparse
import json
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
from training.evaluation import retrieval_metrics  # noqa: E402

ITERATIONS = (10, 25, 50, 100, 200)
TARGET_RATIO = 1.2  # closed form, XLA: time(100 iterations) / time(10 iterations)


def _step_function(layer, jit_compile):
    @tf.function(jit_compile=jit_compile)
    def step(features, weights):
        with tf.GradientTape() as tape:
            tape.watch(features)
            pooled, z = layer(features)
            loss = tf.reduce_sum(pooled * weights) + tf.reduce_sum(tf.square(z))
        grad_features, grad_prototypes = tape.gradient(loss, [features, layer.prototypes])
        return loss, grad_features, grad_prototypes

    return step


def _peak_bytes(step, features, weights):
    tf.config.experimental.reset_memory_stats("CPU:0")
    baseline = tf.config.experimental.get_memory_info("CPU:0")["current"]
    outputs = step(features, weights)
    _ = [o.numpy() for o in outputs]
    return tf.config.experimental.get_memory_info("CPU:0")["peak"] - baseline


def measure(args):
    rng = np.random.default_rng(0)
    shape = (args.batch, args.side, args.side, args.channels)
    features = tf.constant(rng.uniform(0, 1, size=shape).astype(np.float32))
    weights = tf.constant(rng.normal(size=(args.batch, args.channels)).astype(np.float32))
    prototypes = rng.uniform(0, 1, size=(args.prototypes, args.channels)).astype(np.float32)
    rows = []
    for compiler in ("graph", "xla"):
        for gradient in ("closed_form", "autodiff"):
            for iterations in ITERATIONS:
                layer = GeneralizedSumPooling(num_prototypes=args.prototypes, max_iter=iterations, gradient=gradient,
                                              return_attributes=True)
                layer.build(shape)
                layer.prototypes.assign(prototypes)
                step = _step_function(layer, compiler == "xla")
                for _ in range(3):
                    step(features, weights)[0].numpy()
                times = []
                for _ in range(args.repeats):
                    start = time.perf_counter()
                    step(features, weights)[0].numpy()
                    times.append(time.perf_counter() - start)
                peak = _peak_bytes(step, features, weights)
                rows.append({"compiler": compiler, "gradient": gradient, "iterations": iterations,
                             "median_ms": 1e3 * float(np.median(times)), "min_ms": 1e3 * float(np.min(times)),
                             "peak_mib": peak / 2**20})
                print(f"{compiler:5s} {gradient:11s} {iterations:4d} it  median {rows[-1]['median_ms']:8.2f} ms  "
                      f"min {rows[-1]['min_ms']:8.2f} ms  peak {rows[-1]['peak_mib']:7.2f} MiB", flush=True)
    return rows


def _lookup(rows, compiler, gradient, iterations):
    return next(r for r in rows if (r["compiler"], r["gradient"], r["iterations"]) == (compiler, gradient, iterations))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--side", type=int, default=14)
    parser.add_argument("--channels", type=int, default=128)
    parser.add_argument("--prototypes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results", "gsp.json"))
    args = parser.parse_args()

    rows = measure(args)
    summary = {}
    for compiler in ("graph", "xla"):
        for gradient in ("closed_form", "autodiff"):
            base = _lookup(rows, compiler, gradient, 10)
            for iterations in (100, 200):
                row = _lookup(rows, compiler, gradient, iterations)
                summary[f"{compiler}_{gradient}_time_ratio_{iterations}_vs_10"] = row["median_ms"] / base["median_ms"]
                summary[f"{compiler}_{gradient}_peak_ratio_{iterations}_vs_10"] = row["peak_mib"] / base["peak_mib"]
        closed, auto = _lookup(rows, compiler, "closed_form", 100), _lookup(rows, compiler, "autodiff", 100)
        summary[f"{compiler}_autodiff_over_closed_form_time_at_100"] = auto["median_ms"] / closed["median_ms"]
        summary[f"{compiler}_autodiff_over_closed_form_peak_at_100"] = auto["peak_mib"] / closed["peak_mib"]
    ratio = summary["xla_closed_form_time_ratio_100_vs_10"]
    summary["target"] = f"closed form under XLA: time(100 it) <= {TARGET_RATIO} x time(10 it)"
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
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump({"config": vars(args), "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                                     "tensorflow": tf.__version__},
                   "rows": rows, "summary": summary}, handle, indent=2)


if __name__ == "__main__":
    main()
