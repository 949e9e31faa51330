"""GSP's scaling found by Newton's method against Prop. 5.2.1's update (Gurbuz 2022 thesis), on real costs.

The costs are those of the ``resnet20_gsp_retrieval_fashion_mnist`` preset: its backbone's 7x7x64 feature maps of
the first ``--images`` Fashion-MNIST test images against its 64 trained prototypes, as ``GeneralizedSumPooling``
builds them. For each ``epsilon`` (the preset's 0.1 among them) and each method, ``partial_transport`` runs with the
layer's defaults (``threshold=1e-6``, ``max_iter=100``, implicit gradient) in an XLA-compiled forward+backward
step; a second budget (``--long-budget``) shows what the update needs to converge where 100 is not enough. Times
are the median and minimum of ``--repeats`` calls taken in interleaved rounds (every configuration once a round),
so that other processes' load affects all alike; the comparison is the ratio of the two methods in the same run.
Also reported per configuration: the evaluations each problem ran (maximum, median), the share of problems
converged and the largest error. A second part times one evaluation of each method: the same step on
``benchmarks/gsp.py``'s random ``(64, 64, 196)`` cost at ``threshold=0``, 10 and 100 evaluations (``epsilon=0.2``),
the cost of an evaluation being the difference over 90.

    PYTHONPATH=. python benchmarks/gsp_methods.py [--images 128 --repeats 30]

Needs Fashion-MNIST (see ``training.data.fashion_mnist``). Writes ``benchmarks/results/gsp_methods.json``.
"""
import argparse
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from ot_layers import GeneralizedSumPooling  # noqa: E402
from ot_layers.layers.generalized_sum_pooling import _clip_norm, _euclidean_cost  # noqa: E402
from ot_layers.solvers import partial_transport  # noqa: E402
from ot_layers.solvers.partial_transport import METHODS  # noqa: E402
from ot_layers.tensor_ops import find_layer, flatten_feature_map, layer_input_model  # noqa: E402
from report import positive_count, write_json  # noqa: E402
from training.data.fashion_mnist import load_fashion_mnist  # noqa: E402
from zoo.loading import load  # noqa: E402

PRESET = "resnet20_gsp_retrieval_fashion_mnist"
EPSILONS = (0.2, 0.1, 0.03, 0.01)
DEFAULT_BUDGET = 100
FIXED_COUNTS = (10, 100)


def preset_costs(images):
    """``(images, m, n)`` float32 costs between the preset's prototypes and its backbone's feature-map elements,
    and the preset's transport ratio."""
    model = load(PRESET)
    pooling = find_layer(model, GeneralizedSumPooling)
    x, _ = load_fashion_mnist("test", limit=images)
    features = flatten_feature_map(layer_input_model(model, pooling).predict(x, batch_size=128, verbose=0))
    cost = _euclidean_cost(_clip_norm(tf.convert_to_tensor(pooling.prototypes)), _clip_norm(features))
    return cost, pooling.transport_ratio


def _step(transport_ratio, epsilon, method, max_iter, threshold=1e-6):
    """An XLA-compiled forward+backward step on a cost: ``(loss, cost gradient, iterations, converged, error)``."""
    @tf.function(jit_compile=True)
    def step(cost, weights):
        with tf.GradientTape() as tape:
            tape.watch(cost)
            result = partial_transport(cost, transport_ratio, epsilon=epsilon, max_iter=max_iter,
                                       threshold=threshold, method=method)
            loss = tf.reduce_sum(result.residual * weights) + tf.reduce_sum(tf.square(result.plan))
        return loss, tape.gradient(loss, cost), result.iterations, result.converged, result.error

    return step


def _interleaved_times(steps, inputs, repeats):
    """``{key: [seconds]}`` of ``repeats`` rounds, each calling every step of ``steps`` once on ``inputs``."""
    times = {key: [] for key in steps}
    for _ in range(repeats):
        for key, step in steps.items():
            start = time.perf_counter()
            step(*inputs)[0].numpy()
            times[key].append(time.perf_counter() - start)
    return times


def measure(cost, transport_ratio, repeats, long_budget):
    weights = tf.constant(np.random.default_rng(0).normal(size=(cost.shape[0], cost.shape[-1])), tf.float32)
    configs = [(epsilon, method, DEFAULT_BUDGET) for epsilon in EPSILONS for method in METHODS]
    configs += [(epsilon, "fixed_point", long_budget) for epsilon in EPSILONS[2:]]
    steps = {key: _step(transport_ratio, *key) for key in configs}
    outputs = {key: [t.numpy() for t in step(cost, weights)] for key, step in steps.items()}  # compile, and record
    times = _interleaved_times(steps, (cost, weights), repeats)
    rows = []
    for key in configs:
        _, _, iterations, converged, error = outputs[key]
        rows.append({"epsilon": key[0], "method": key[1], "max_iter": key[2],
                     "median_ms": 1e3 * float(np.median(times[key])), "min_ms": 1e3 * float(np.min(times[key])),
                     "evaluations_max": int(iterations.max()), "evaluations_median": float(np.median(iterations)),
                     "converged_share": float(converged.mean()), "error_max": float(error.max())})
        row = rows[-1]
        print(f"epsilon {key[0]:<5} {key[1]:11s} max_iter {key[2]:5d}: median {row['median_ms']:8.2f} ms, "
              f"min {row['min_ms']:8.2f} ms, evaluations max {row['evaluations_max']:5d} "
              f"median {row['evaluations_median']:7.1f}, converged {row['converged_share']:.3f}, "
              f"error max {row['error_max']:.1e}", flush=True)
    return rows


def measure_evaluation_cost(repeats):
    """Rows of min/median times at a fixed count of 10 and 100 evaluations, per method, and the per-evaluation cost
    in ms from the minima."""
    rng = np.random.default_rng(0)
    cost = tf.constant(rng.uniform(0, 2, size=(64, 64, 196)).astype(np.float32))
    weights = tf.constant(rng.normal(size=(64, 196)).astype(np.float32))
    steps = {(method, count): _step(0.3, 0.2, method, count, threshold=0) for method in METHODS
             for count in FIXED_COUNTS}
    for step in steps.values():
        step(cost, weights)[0].numpy()
    times = _interleaved_times(steps, (cost, weights), repeats)
    rows = [{"method": method, "evaluations": count, "median_ms": 1e3 * float(np.median(times[(method, count)])),
             "min_ms": 1e3 * float(np.min(times[(method, count)]))} for method, count in steps]
    per_evaluation = {method: (1e3 * (min(times[(method, FIXED_COUNTS[1])]) - min(times[(method, FIXED_COUNTS[0])]))
                               / (FIXED_COUNTS[1] - FIXED_COUNTS[0])) for method in METHODS}
    for row in rows:
        print(f"{row['method']:11s} {row['evaluations']:4d} evaluations (threshold 0): median {row['median_ms']:8.2f}"
              f" ms, min {row['min_ms']:8.2f} ms", flush=True)
    return rows, per_evaluation


def summarize(rows):
    """Per ``epsilon``: the update's time and evaluations over Newton's at the default budget."""
    def find(epsilon, method, budget=DEFAULT_BUDGET):
        return next(r for r in rows if (r["epsilon"], r["method"], r["max_iter"]) == (epsilon, method, budget))

    summary = {}
    for epsilon in EPSILONS:
        newton, update = find(epsilon, "newton"), find(epsilon, "fixed_point")
        summary[f"epsilon_{epsilon}"] = {
            "fixed_point_over_newton_min_time": update["min_ms"] / newton["min_ms"],
            "fixed_point_over_newton_median_time": update["median_ms"] / newton["median_ms"],
            "evaluations_max": {"newton": newton["evaluations_max"], "fixed_point": update["evaluations_max"]},
            "converged_share": {"newton": newton["converged_share"], "fixed_point": update["converged_share"]}}
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=positive_count, default=128)
    parser.add_argument("--repeats", type=positive_count, default=30)
    parser.add_argument("--long-budget", type=positive_count, default=3000,
                        help="max_iter of the update's second budget, at the two smallest epsilons")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "gsp_methods.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    cost, transport_ratio = preset_costs(args.images)
    rows = measure(cost, transport_ratio, args.repeats, args.long_budget)
    summary = summarize(rows)
    evaluation_rows, per_evaluation = measure_evaluation_cost(args.repeats)
    summary["per_evaluation_ms"] = per_evaluation
    summary["newton_over_fixed_point_per_evaluation"] = per_evaluation["newton"] / per_evaluation["fixed_point"]
    print("\nsummary")
    for epsilon, values in summary.items():
        print(f"  {epsilon}: {values}")
    write_json(args.out, {"config": {**vars(args), "preset": PRESET, "cost_shape": list(cost.shape),
                                     "transport_ratio": transport_ratio, "threshold": 1e-6, "gradient": "implicit"},
                          "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                      "tensorflow": tf.__version__, "keras": keras.__version__,
                                      "load_average_before": load_before, "load_average_after": os.getloadavg()},
                          "rows": rows, "fixed_count_rows": evaluation_rows, "summary": summary})


if __name__ == "__main__":
    main()
