"""Across seeds: the Fashion-MNIST zero-shot retrieval ablations of ``experiments/ccp_fashion_mnist.py`` (CCP,
Gurbuz 2022, ch. 3) and ``experiments/edms_fashion_mnist.py`` (EDMS, Aziere and Todorovic 2019), one run per seed
(``--seed S``: the initialization, the batches and, for EDMS, the meta-class partitions; the data split is fixed).

For each variant, mean +- sd over the seeds of the test metrics; for the comparisons the papers make, the per-seed
differences of test MAP@R (mean +- sd, in how many seeds the sign held, and the two-sided p-value of a paired t-test).

Reads ``experiments/results/{ccp,edms}_fashion_mnist.json`` (seed 0) and ``..._seed{S}.json``; writes
``experiments/results/{ccp,edms}_fashion_mnist_seeds.json`` and prints the Markdown tables of docs/results/ccp.md and
docs/results/edms.md. Run (after the runs): ``python experiments/zero_shot_seeds.py``.
"""
import glob
import json
import os
import re

import numpy as np
from scipy import stats

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

# Per experiment: (label, metric path) columns, and the comparisons as (label, minuend, subtrahend) over one path.
EXPERIMENTS = {
    "ccp": {
        "columns": [("best val MAP@R", ("val_map_at_r",)), ("test MAP@R", ("test", "map_at_r")),
                    ("test R@1", ("test", "recall_at_1")), ("test NMI", ("test", "nmi")),
                    ("re-inits", ("reinitializations",))],
        "compared": ("test", "map_at_r"),
        "comparisons": [("CCP k-center - ProxyAnchor", "ccp_kcenter", "proxy_anchor"),
                        ("CCP k-center - CCP random sampling", "ccp_kcenter", "ccp_random"),
                        ("CCP k-center: proximal term - none", "ccp_kcenter", "ccp_kcenter_no_prox")],
    },
    "edms": {
        "columns": [("learner 0 MAP@R", ("single_learner", "map_at_r")),
                    ("learner 0 R@1", ("single_learner", "recall_at_1")),
                    ("ensemble MAP@R", ("ensemble", "map_at_r")), ("ensemble R@1", ("ensemble", "recall_at_1")),
                    ("ensemble NMI", ("ensemble", "nmi"))],
        "compared": ("ensemble", "map_at_r"),
        "single": ("single_learner", "map_at_r"),
        "comparisons": [("random walk: RW+P* - P*", "RW+P*", "P*"),
                        ("hard proxies: RW+P* - RW+P", "RW+P*", "RW+P"),
                        ("contextual - intrinsic loss: RW+P* - RW-int+P*", "RW+P*", "RW-int+P*")],
    },
}


def runs(name):
    """``{seed: {variant: result}}`` of experiment ``name``'s runs in ``RESULTS``."""
    found = {}
    for path in glob.glob(os.path.join(RESULTS, f"{name}_fashion_mnist*.json")):
        match = re.fullmatch(rf"{name}_fashion_mnist(?:_seed(\d+))?\.json", os.path.basename(path))
        if not match:
            continue
        with open(path) as handle:
            report = json.load(handle)
        seed = report["args"]["seed"]
        if int(match.group(1) or 0) != seed:
            raise ValueError(f"{path} records seed {seed}, its name another")
        variants = {result["variant"]: result for result in report["results"]}
        if set(variants) != set(report["args"]["variants"]):  # the script rewrites its file after each variant
            print(f"{os.path.basename(path)} left out: unfinished ({len(variants)} of "
                  f"{len(report['args']['variants'])} variants)")
            continue
        found[seed] = variants
    return dict(sorted(found.items()))


def value(result, path):
    """The number at ``path`` in ``result``; of a list (the per-epoch validation scores), its largest."""
    for key in path:
        result = result[key]
    return float(max(result) if isinstance(result, list) else result)


def spread(values):
    """Mean and sample sd (``ddof=1``; 0 for one value)."""
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def differences(results, seeds, first, second, path):
    per_seed = [value(results[s][first], path) - value(results[s][second], path) for s in seeds]
    mean, sd = spread(per_seed)
    # two-sided paired t-test of a zero mean difference (needs two seeds and some spread)
    p_value = float(stats.ttest_1samp(per_seed, 0.0).pvalue) if len(per_seed) > 1 and sd > 0 else None
    return dict(per_seed=[round(d, 4) for d in per_seed], mean=mean, sd=sd,
                positive_in=f"{sum(d > 0 for d in per_seed)}/{len(per_seed)}", paired_t_p=p_value)


def summary(name):
    spec, results = EXPERIMENTS[name], runs(name)
    seeds = list(results)
    variants = [v for v in results[seeds[0]] if all(v in results[s] for s in seeds)]
    rows = []
    for variant in variants:
        cells = {}
        for label, path in spec["columns"]:
            values = [value(results[s][variant], path) for s in seeds]
            mean, sd = spread(values)
            cells[label] = dict(per_seed=values, mean=mean, sd=sd)
        rows.append(dict(variant=variant, **cells))
    comparisons = []
    for label, first, second in spec["comparisons"]:
        row = dict(comparison=label, **{"_".join(spec["compared"]): differences(results, seeds, first, second,
                                                                                 spec["compared"])})
        if "single" in spec:
            row["_".join(spec["single"])] = differences(results, seeds, first, second, spec["single"])
        comparisons.append(row)
    return dict(seeds=seeds, rows=rows, comparisons=comparisons)


def main():
    for name, spec in EXPERIMENTS.items():
        report = summary(name)
        with open(os.path.join(RESULTS, f"{name}_fashion_mnist_seeds.json"), "w") as handle:
            json.dump(report, handle, indent=2)
        labels = [label for label, _ in spec["columns"]]
        print(f"\n{name}: seeds {report['seeds']}, mean +- sd over seeds:\n")
        print("| variant | " + " | ".join(labels) + " |\n|" + " --- |" * (len(labels) + 1))
        for row in report["rows"]:
            print(f"| {row['variant']} | " + " | ".join(f"{row[l]['mean']:.4f} +- {row[l]['sd']:.4f}" for l in labels)
                  + " |")
        keys = [key for key in report["comparisons"][0] if key != "comparison"]
        print("\n| difference | " + " | ".join(f"{k}: per seed | mean +- sd | positive in | paired t p" for k in keys)
              + " |\n|" + " --- |" * (1 + 4 * len(keys)))
        for row in report["comparisons"]:
            cells = [f"{', '.join(f'{d:+.4f}' for d in row[k]['per_seed'])} | {row[k]['mean']:+.4f} +- "
                     f"{row[k]['sd']:.4f} | {row[k]['positive_in']} | "
                     + ("-" if row[k]["paired_t_p"] is None else f"{row[k]['paired_t_p']:.2f}") for k in keys]
            print(f"| {row['comparison']} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
