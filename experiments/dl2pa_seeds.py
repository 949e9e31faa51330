"""Across seeds: DL2PA on Fashion-MNIST with d < K (``experiments/dl2pa_fashion_mnist.py``, Saadabadi et al. 2024),
the runs of each prototype dimension ``d`` in one file, ``experiments/results/dl2pa_fashion_mnist_d{d}.json``.

For each ``d`` and method, the test accuracy's mean +- sd over the seeds and, for the dynamic methods, how many
classes changed prototype in each epoch; for the comparisons the paper makes (dynamic against fixed assignment) and
against the softmax baseline, the per-seed differences of test accuracy (mean +- sd, in how many seeds the sign held,
and the two-sided p-value of a paired t-test, not corrected for the several comparisons). A seed changes the network's
initialization and the data order; the prototypes are ``estimate_prototypes(10, d, seed=0)`` in every run.

Writes ``experiments/results/dl2pa_fashion_mnist_seeds.json`` and prints the Markdown tables of
docs/results/hyperspherical.md. Run (after the runs): ``python experiments/dl2pa_seeds.py``.
"""
import glob
import json
import os
import re

from seed_runs import RESULTS, paired_differences, spread

COMPARISONS = [("dynamic (per epoch) - fixed", "dynamic", "fixed"),
               ("dynamic_steps (every 10 batches) - fixed", "dynamic_steps", "fixed"),
               ("dynamic - softmax", "dynamic", "softmax"),
               ("dynamic_steps - softmax", "dynamic_steps", "softmax")]


def runs_by_dim():
    """``{d: {method: {seed: result}}}`` of the run files ``dl2pa_fashion_mnist_d{d}.json``; a file whose runs
    name another ``d``, or a second run of one method and seed, raises ``ValueError``."""
    found = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "dl2pa_fashion_mnist_d*.json"))):
        match = re.fullmatch(r"dl2pa_fashion_mnist_d(\d+)\.json", os.path.basename(path))
        if not match:
            continue
        dim = int(match.group(1))
        with open(path) as handle:
            report = json.load(handle)
        methods = found.setdefault(dim, {})
        for result in report["results"]:
            if result["dim"] != dim:
                raise ValueError(f"{path} holds a run of d = {result['dim']}")
            seeds = methods.setdefault(result["method"], {})
            if result["seed"] in seeds:
                raise ValueError(f"{path}: a second run of {result['method']}, seed {result['seed']}")
            seeds[result["seed"]] = result
    return found


def summary(methods):
    """One ``d``'s rows (mean +- sd of test accuracy, prototype changes per epoch) and comparisons (over the seeds
    both methods ran; a comparison whose methods share no seed is left out)."""
    rows = []
    for method, seeds in methods.items():
        accuracies = [seeds[s]["test_accuracy"] for s in sorted(seeds)]
        mean, sd = spread(accuracies)
        row = dict(method=method, seeds=sorted(seeds), per_seed=accuracies, mean=mean, sd=sd)
        if all("prototype_changes" in seeds[s] for s in seeds):
            row["prototype_changes"] = {s: seeds[s]["prototype_changes"] for s in sorted(seeds)}
        rows.append(row)
    comparisons = []
    for label, first, second in COMPARISONS:
        shared = sorted(set(methods.get(first, {})) & set(methods.get(second, {})))
        if not shared:
            continue
        per_seed = [methods[first][s]["test_accuracy"] - methods[second][s]["test_accuracy"] for s in shared]
        comparisons.append(dict(comparison=label, seeds=shared, **paired_differences(per_seed)))
    return dict(rows=rows, comparisons=comparisons)


def main():
    found = runs_by_dim()
    if not found:
        print(f"no run files dl2pa_fashion_mnist_d*.json in {RESULTS}")
        return
    report = {str(dim): summary(methods) for dim, methods in sorted(found.items())}
    with open(os.path.join(RESULTS, "dl2pa_fashion_mnist_seeds.json"), "w") as handle:
        json.dump(report, handle, indent=2)
    print("| d | method | seeds | test accuracy, mean +- sd | per seed | classes that changed prototype, by epoch |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for dim, entry in report.items():
        for row in entry["rows"]:
            changes = "; ".join(f"seed {s}: {', '.join(map(str, c))}" for s, c in row["prototype_changes"].items()) \
                if "prototype_changes" in row else "-"
            print(f"| {dim} | {row['method']} | {len(row['seeds'])} | {row['mean']:.4f} +- {row['sd']:.4f} | "
                  f"{', '.join(f'{a:.4f}' for a in row['per_seed'])} | {changes} |")
    print("\n| d | difference of test accuracy | per seed | mean +- sd | positive in | paired t p |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for dim, entry in report.items():
        for row in entry["comparisons"]:
            p_value = "-" if row["paired_t_p"] is None else f"{row['paired_t_p']:.2f}"
            print(f"| {dim} | {row['comparison']} | {', '.join(f'{d:+.4f}' for d in row['per_seed'])} | "
                  f"{row['mean']:+.4f} +- {row['sd']:.4f} | {row['positive_in']} | {p_value} |")


if __name__ == "__main__":
    main()
