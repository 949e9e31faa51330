"""Hyperspherical prototype estimation (SPEC S6): pairwise-cosine extremes vs the simplex-ETF value -1/(K-1).

Prints a table and writes benchmarks/results/prototype_estimation.json.

    PYTHONPATH=. python benchmarks/prototype_estimation.py
"""
import json
import os
import time

import numpy as np

from ot_layers.solvers import estimate_prototypes

CASES = [(10, 9, 1000), (10, 16, 1000), (20, 19, 1000), (10, 3, 1000), (10, 8, 1000), (100, 16, 1000),
         (50, 49, 1000), (50, 49, 5000), (100, 99, 1000), (100, 99, 5000)]


def main():
    rows = []
    for k, d, steps in CASES:
        start = time.perf_counter()
        p = estimate_prototypes(k, d, steps=steps, file_cache=False)
        seconds = time.perf_counter() - start
        cos = (p @ p.T)[~np.eye(k, dtype=bool)]
        rows.append({"K": k, "d": d, "steps": steps, "max_cos": float(cos.max()), "min_cos": float(cos.min()),
                     "etf_cos": -1.0 / (k - 1), "etf_holds": bool(d >= k - 1 and abs(cos.max() + 1 / (k - 1)) <= 0.01),
                     "seconds": round(seconds, 2)})
    print("| K | d | steps | max cos | min cos | -1/(K-1) | ETF within 0.01 | s |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        etf = ("yes" if r["etf_holds"] else "no") if r["d"] >= r["K"] - 1 else "n/a (d < K-1)"
        print(f"| {r['K']} | {r['d']} | {r['steps']} | {r['max_cos']:.4f} | {r['min_cos']:.4f} | "
              f"{r['etf_cos']:.4f} | {etf} | {r['seconds']} |")
    os.makedirs("benchmarks/results", exist_ok=True)
    with open("benchmarks/results/prototype_estimation.json", "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
