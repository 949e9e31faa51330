"""The Sinkhorn solver's batched products under TensorFlow's XLA on the CPU: fused multiply-and-sum against dots.

Under XLA (``jit_compile=True``) the Sinkhorn iterations' products ``K v`` and ``K^T u``, the Gram matrix of the
implicit backward and its small linear solves run either as elementwise products and sums (with an unrolled
Cholesky) or as dots (``einsum``, and a batched solver). ``ot_layers.backends.fused_small_products`` picks by the
cost matrix's last axis: fused up to ``FUSED_PRODUCTS_MAX_LAST_AXIS`` (8) columns, dots beyond. This script compiles
each workload three ways in one process and times them in interleaved rounds (the median of the rounds after
compiling):

  fused    every product fused (the solver's choice before the size rule);
  dots     every product as dots;
  by_size  the solver's choice (fused up to 8 columns);

on five workloads:

  mpw_head          the MPW head of ``benchmarks/sinkhorn.py`` (B=64 maps of n=64 elements against K=100 classes of
                    M=4 proxies, 20 iterations), forward + backward;
  deepemd_episode   the DeepEMD head of one 5-way 15-query episode (``EMDHead(method="sinkhorn")`` with the DeepEMD
                    preset's settings between 75 query and 5 support maps of 7 x 7 x 64, ReLU of Gaussian features:
                    375 problems of 49 x 49), forward only (as in evaluation);
  deepemd_training  the same head, forward + backward (as in meta-training);
  columns_8, _16    Sinkhorn on 1,600 random costs of 64 x 8 and 64 x 16 (30 iterations), forward + backward: on
                    either side of the size where the choice changes;

and checks that the three ways give the same numbers (the largest difference of the outputs relative to their
scale). Ratios only: the absolute times depend on the machine and its load.

    python benchmarks/xla_cpu_products.py [--repeats 15] [--out benchmarks/results/xla_cpu_products.json]
"""
import argparse
import importlib
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["KERAS_BACKEND"] = "tensorflow"
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from ot_layers.backends import tensorflow_backend  # noqa: E402
from ot_layers.layers.emd_head import EMDHead  # noqa: E402
from report import positive_count, write_json  # noqa: E402

SOLVER = importlib.import_module("ot_layers.solvers.sinkhorn")  # the module (the package exports the function)
MODES = {"fused": lambda matrix: tensorflow_backend.in_xla_context(), "dots": lambda matrix: False,
         "by_size": SOLVER.fused_small_products}
EPISODE = dict(queries=75, ways=5, side=7, dim=64)


def _mpw_head():
    """``benchmarks/sinkhorn.py``'s XLA step of otzoo's head, flattened into one vector."""
    sys.path.insert(0, HERE)
    import sinkhorn as mpw_benchmark

    step = mpw_benchmark._tf_step("otzoo_xla")
    return lambda: np.concatenate([np.ravel(t) for t in step()])


def _xla(fn):
    """``fn`` compiled with XLA (traced at its first call), its output as one NumPy vector."""
    compiled = tf.function(fn, jit_compile=True)
    return lambda: tf.reshape(compiled(), [-1]).numpy()


def _deepemd(backward):
    rng = np.random.default_rng(0)
    maps = lambda count: tf.constant(np.maximum(rng.normal(  # noqa: E731
        size=(count, EPISODE["side"], EPISODE["side"], EPISODE["dim"])), 0.0), tf.float32)
    query, support = maps(EPISODE["queries"]), maps(EPISODE["ways"])
    head = EMDHead(method="sinkhorn", epsilon=0.03, max_iter=100, threshold=1e-3)
    head([query, support])  # builds the head outside the compiled functions

    def step():
        if not backward:
            return head([query, support])
        with tf.GradientTape() as tape:
            tape.watch([query, support])
            loss = tf.reduce_sum(head([query, support]) ** 2)
        return tf.concat([tf.reshape(g, [-1]) for g in tape.gradient(loss, [query, support])], axis=0)

    return _xla(step)


def _columns(count):
    """Sinkhorn on 1,600 random costs of 64 x ``count`` (epsilon 0.1, 30 iterations, implicit gradient), forward +
    backward: around the size where the choice changes."""
    cost = tf.constant(np.random.default_rng(0).uniform(0, 2, (1600, 64, count)), tf.float32)
    weights = tf.constant(np.random.default_rng(1).normal(size=(1600, 64, count)), tf.float32)

    def step():
        with tf.GradientTape() as tape:
            tape.watch(cost)
            loss = tf.reduce_sum(SOLVER.sinkhorn(cost, epsilon=0.1, max_iter=30, threshold=0.0).plan * weights)
        return tape.gradient(loss, cost)

    return _xla(step)


def _time(make_step, repeats):
    """Each mode's step made and first run (traced and compiled) under its choice of products, which a traced
    function keeps, then timed in interleaved rounds."""
    chosen = (SOLVER.fused_matvec, SOLVER.fused_small_products)
    steps, outputs = {}, {}
    try:
        for name, choice in MODES.items():
            SOLVER.fused_matvec = SOLVER.fused_small_products = choice
            steps[name] = make_step()
            outputs[name] = steps[name]()
    finally:
        SOLVER.fused_matvec, SOLVER.fused_small_products = chosen
    times = {name: [] for name in MODES}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    median = {name: 1000 * statistics.median(values) for name, values in times.items()}
    scale = float(np.abs(outputs["dots"]).max())
    return {"median_ms": median, "min_ms": {name: 1000 * min(values) for name, values in times.items()},
            "fused_over_by_size": median["fused"] / median["by_size"],
            "dots_over_by_size": median["dots"] / median["by_size"],
            "max_relative_difference": max(float(np.abs(outputs[name] - outputs["dots"]).max()) / scale
                                           for name in MODES)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_count, default=15)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "xla_cpu_products.json"))
    args = parser.parse_args()
    workloads = {"mpw_head": _mpw_head, "deepemd_episode": lambda: _deepemd(backward=False),
                 "deepemd_training": lambda: _deepemd(backward=True), "columns_8": lambda: _columns(8),
                 "columns_16": lambda: _columns(16)}
    report = {"tensorflow": tf.__version__, "cpu_count": os.cpu_count(), "repeats": args.repeats,
              "fused_products_max_last_axis": tensorflow_backend.FUSED_PRODUCTS_MAX_LAST_AXIS,
              "load_average_before": os.getloadavg(),
              "workloads": {name: _time(make, args.repeats) for name, make in workloads.items()}}
    report["load_average_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    write_json(args.out, report)


if __name__ == "__main__":
    main()
