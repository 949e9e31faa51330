"""Across seeds: the Fashion-MNIST zero-shot retrieval ablations of ``experiments/ccp_fashion_mnist.py`` (CCP,
Gurbuz 2022, ch. 3) and ``experiments/edms_fashion_mnist.py`` (EDMS, Aziere and Todorovic 2019), one run per seed
(``--seed S``; what a seed varies is listed above ``EXPERIMENTS``; the data split is fixed).

For each variant, mean +- sd over the seeds of the test metrics; for the comparisons the papers make, the per-seed
differences of test MAP@R (mean +- sd, in how many seeds the sign held, and the two-sided p-value of a paired t-test).

Reads ``experiments/results/{ccp,edms,edms_hard_proxies}_fashion_mnist.json`` (seed 0) and ``..._seed{S}.json``
(finished runs with the same settings; an unfinished one is left out with a message); writes
``experiments/results/{ccp,edms,edms_hard_proxies}_fashion_mnist_seeds.json`` and prints Markdown tables, the
source of the tables of docs/results/ccp.md and docs/results/edms.md. The p-values are not corrected for the several comparisons.
Run (after the runs): ``python experiments/zero_shot_seeds.py``.
"""
import json
import os

from seed_runs import RESULTS, paired_differences, seed_reports, spread

# Per experiment: (label, metric path) columns, and the comparisons as (label, minuend, subtrahend) over one path.
# What a seed varies: the initialization and the batches; CCP's re-initialization draws; EDMS's meta-class
# partitions and the anchors and members of its hard proxies.
EXPERIMENTS = {
    "ccp": {
        "columns": [("best val MAP@R", ("val_map_at_r",)), ("test MAP@R", ("test", "map_at_r")),
                    ("test R@1", ("test", "recall_at_1")), ("test NMI", ("test", "nmi")),
                    ("re-inits", ("reinitializations",))],
        "compared": ("test", "map_at_r"),
        "comparisons": [("CCP k-center - ProxyAnchor", "ccp_kcenter", "proxy_anchor"),
                        ("CCP random sampling - ProxyAnchor", "ccp_random", "proxy_anchor"),
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
    # The hard proxies at 100 descent steps (the runs above) and run to eq. 7's minimum on the sphere (RW+P*conv)
    "edms_hard_proxies": {
        "columns": [("learner 0 MAP@R", ("single_learner", "map_at_r")),
                    ("ensemble MAP@R", ("ensemble", "map_at_r")), ("ensemble R@1", ("ensemble", "recall_at_1")),
                    ("proxy shift |p* - p|", ("proxy_shift",))],
        "compared": ("ensemble", "map_at_r"),
        "single": ("single_learner", "map_at_r"),
        "comparisons": [("hard proxies, 100 steps: RW+P* - RW+P", "RW+P*", "RW+P"),
                        ("hard proxies, converged: RW+P*conv - RW+P", "RW+P*conv", "RW+P"),
                        ("converged - 100 steps: RW+P*conv - RW+P*", "RW+P*conv", "RW+P*")],
    },
}


def runs(name):
    """``{seed: {variant: result}}`` of experiment ``name``'s finished runs in ``RESULTS``, which must share their
    settings (all arguments but ``seed`` and ``out``)."""
    found, settings = {}, None
    for seed, report in seed_reports(f"{name}_fashion_mnist").items():
        path = os.path.basename(report["path"])
        variants = {result["variant"]: result for result in report["results"]}
        if set(variants) != set(report["args"]["variants"]):  # the script rewrites its file after each variant
            print(f"{path} left out: unfinished ({len(variants)} of {len(report['args']['variants'])} variants)")
            continue
        setting = {k: v for k, v in report["args"].items() if k not in ("seed", "out")}
        if settings is not None and setting != settings:
            raise ValueError(f"{path} was run with other settings than the runs before it: {setting}")
        found[seed], settings = variants, setting
    return found


def value(result, path):
    """The number at ``path`` in ``result``; of a list (the per-epoch validation scores), its largest."""
    for key in path:
        result = result[key]
    return float(max(result) if isinstance(result, list) else result)


def differences(results, seeds, first, second, path):
    return paired_differences([value(results[s][first], path) - value(results[s][second], path) for s in seeds])


def summary(name):
    spec, results = EXPERIMENTS[name], runs(name)
    seeds = list(results)
    if not seeds:
        print(f"{name}: no finished runs in {RESULTS}")
        return None
    variants = list(results[seeds[0]])  # every run holds the same variants (runs: finished, same settings)
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
        if first not in variants or second not in variants:
            print(f"{name}: '{label}' left out: a variant is missing from some seed's run")
            continue
        row = dict(comparison=label, **{"_".join(spec["compared"]): differences(results, seeds, first, second,
                                                                                 spec["compared"])})
        if "single" in spec:
            row["_".join(spec["single"])] = differences(results, seeds, first, second, spec["single"])
        comparisons.append(row)
    return dict(seeds=seeds, rows=rows, comparisons=comparisons)


def main():
    for name, spec in EXPERIMENTS.items():
        report = summary(name)
        if report is None:
            continue
        with open(os.path.join(RESULTS, f"{name}_fashion_mnist_seeds.json"), "w") as handle:
            json.dump(report, handle, indent=2)
        labels = [label for label, _ in spec["columns"]]
        print(f"\n{name}: seeds {report['seeds']}, mean +- sd over seeds:\n")
        print("| variant | " + " | ".join(labels) + " |\n|" + " --- |" * (len(labels) + 1))
        for row in report["rows"]:
            print(f"| {row['variant']} | "
                  + " | ".join(f"{row[label]['mean']:.4f} +- {row[label]['sd']:.4f}" for label in labels) + " |")
        if not report["comparisons"]:
            continue
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
