"""The Sinkhorn iterations' batched matrix-vector products on PyTorch's CPU: multiply-and-sum against ``einsum``.

On the PyTorch backend with tensors on the CPU, ``ot_layers.backends.fused_matvec`` makes the Sinkhorn iterations
compute ``K v`` and ``K^T u`` over a batch of small matrices as an elementwise product and a sum, in place of
``einsum`` (PyTorch's batched matmul, slow for many small matrices there). This script times both ways in one
process, in interleaved rounds (the median of the rounds after a warm-up), on two workloads:

  mpw_head         the MPW head of ``benchmarks/sinkhorn.py``: B=64 maps of n=64 elements against K=100 classes of
                   M=4 proxies, 20 iterations, forward + backward (``loss.backward()``);
  deepemd_episode  the DeepEMD head of one 5-way 15-query episode: ``EMDHead(method="sinkhorn")`` with the DeepEMD
                   preset's settings (epsilon 0.03, kernel domain, at most 100 iterations, threshold 1e-3,
                   cross-reference node weights) between 75 query and 5 support maps of 7 x 7 x 64 (ReLU of
                   Gaussian features: 375 problems of 49 x 49), forward only (as in evaluation).

and checks that both ways give the same numbers (the largest relative difference of the outputs). Ratios only: the
absolute times depend on the machine and its load.

    python benchmarks/torch_cpu_matvec.py [--repeats 15] [--out benchmarks/results/torch_cpu_matvec.json]
"""
import argparse
import importlib
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
os.environ["KERAS_BACKEND"] = "torch"
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from ot_layers.layers.emd_head import EMDHead  # noqa: E402
from report import positive_count, write_json  # noqa: E402

SOLVER = importlib.import_module("ot_layers.solvers.sinkhorn")  # the module (the package exports the function)
EPISODE = dict(queries=75, ways=5, side=7, dim=64)


def _mpw_head():
    sys.path.insert(0, HERE)
    import sinkhorn as mpw_benchmark

    step = mpw_benchmark._keras_step()
    return lambda: torch.cat([g.reshape(-1) for g in step()])


def _deepemd_episode():
    rng = np.random.default_rng(0)
    maps = lambda count: torch.as_tensor(np.maximum(rng.normal(  # noqa: E731
        size=(count, EPISODE["side"], EPISODE["side"], EPISODE["dim"])), 0.0).astype(np.float32))
    query, support = maps(EPISODE["queries"]), maps(EPISODE["ways"])
    head = EMDHead(method="sinkhorn", epsilon=0.03, max_iter=100, threshold=1e-3)
    return lambda: head([query, support]).reshape(-1)


def _time(step, repeats):
    modes = {"fused": SOLVER.fused_matvec, "einsum": lambda matrix: False}
    outputs, times = {}, {name: [] for name in modes}
    try:
        for name, choice in modes.items():
            SOLVER.fused_matvec = choice
            outputs[name] = step().detach().numpy()  # warm-up, and the values compared
        for _ in range(repeats):
            for name, choice in modes.items():
                SOLVER.fused_matvec = choice
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    finally:
        SOLVER.fused_matvec = modes["fused"]
    median = {name: 1000 * statistics.median(values) for name, values in times.items()}
    scale = float(np.abs(outputs["einsum"]).max())
    return {"median_ms": median, "min_ms": {name: 1000 * min(values) for name, values in times.items()},
            "einsum_over_fused": median["einsum"] / median["fused"],
            "max_relative_difference": float(np.abs(outputs["fused"] - outputs["einsum"]).max()) / scale}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_count, default=15)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "torch_cpu_matvec.json"))
    args = parser.parse_args()
    if not SOLVER.fused_matvec(torch.zeros(1)):
        raise SystemExit("fused_matvec is off for CPU tensors here: nothing to compare.")
    report = {"torch": torch.__version__, "threads": torch.get_num_threads(), "repeats": args.repeats,
              "workloads": {"mpw_head": _time(_mpw_head(), args.repeats),
                            "deepemd_episode": _time(_deepemd_episode(), args.repeats)}}
    print(json.dumps(report, indent=2))
    write_json(args.out, report)


if __name__ == "__main__":
    main()
