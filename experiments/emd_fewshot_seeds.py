"""Across seeds: the Fashion-MNIST few-shot runs of ``experiments/emd_fewshot.py`` (one run per seed and shot
count; a seed is a whole replicate: its own 8,000 base images, initialization, meta-training episodes and test
episodes) summarized as mean +- sd over the seeds of each row's accuracy, and the comparisons the DeepEMD paper
(Zhang et al. 2022) makes as per-seed differences (mean +- sd, and in how many seeds the sign held).

Reads ``experiments/results/emd_fewshot_{K}shot.json`` (seed 0) and ``emd_fewshot_{K}shot_seed{S}.json``; writes
``experiments/results/emd_fewshot_seeds.json`` and prints the Markdown tables of docs/results/emd.md.
Run (after the runs; the commands are in docs/results/emd.md): ``python experiments/emd_fewshot_seeds.py``.
"""
import json
import os

import numpy as np

from seed_runs import RESULTS, seed_reports, spread

# (label, backbone key, classifier key) per shot count, in the order of the tables.
ROWS = {
    1: [("pre-trained | ProtoNet", "pretrained", "protonet"),
        ("pre-trained | EMD, cross-reference", "pretrained", "emd_sinkhorn_cross_reference"),
        ("pre-trained | EMD, uniform", "pretrained", "emd_sinkhorn_uniform"),
        ("EMD meta-trained | EMD, cross-reference", "emd_meta", "emd_sinkhorn_cross_reference"),
        ("EMD meta-trained | EMD, uniform", "emd_meta", "emd_sinkhorn_uniform"),
        ("EMD meta-trained | ProtoNet", "emd_meta", "protonet"),
        ("ProtoNet meta-trained | ProtoNet", "proto_meta", "protonet"),
        ("EMD meta-trained | EMD exact, cross-reference ({exact} episodes)", "emd_meta_exact_vs_sinkhorn",
         "emd_exact_cross_reference"),
        ("EMD meta-trained | EMD entropic, cross-reference (same {exact})", "emd_meta_exact_vs_sinkhorn",
         "emd_sinkhorn_cross_reference")],
    5: [("pre-trained | ProtoNet", "pretrained", "protonet"),
        ("pre-trained | EMD merge, cross-reference", "pretrained", "emd_sinkhorn_merge_cross_reference"),
        ("pre-trained | EMD merge, uniform", "pretrained", "emd_sinkhorn_merge_uniform"),
        ("EMD meta-trained | ProtoNet", "emd_meta", "protonet"),
        ("ProtoNet meta-trained | ProtoNet", "proto_meta", "protonet"),
        ("EMD meta-trained | EMD merge, cross-reference", "emd_meta", "emd_sinkhorn_merge_cross_reference"),
        ("EMD meta-trained | EMD merge, uniform", "emd_meta", "emd_sinkhorn_merge_uniform"),
        ("EMD meta-trained | structured FC (fine-tuned, {sfc} episodes)", "emd_meta_sfc_comparison",
         "structured_fc"),
        ("EMD meta-trained | nearest neighbour (same {sfc})", "emd_meta_sfc_comparison", "nearest_neighbour"),
        ("EMD meta-trained | merge (same {sfc})", "emd_meta_sfc_comparison", "merge")],
}

# (label, (backbone, classifier) minuend, (backbone, classifier) subtrahend) per shot count.
COMPARISONS = {
    1: [("EMD (own backbone) - ProtoNet (own backbone)", ("emd_meta", "emd_sinkhorn_cross_reference"),
         ("proto_meta", "protonet")),
        ("cross-reference - uniform weights (EMD backbone)", ("emd_meta", "emd_sinkhorn_cross_reference"),
         ("emd_meta", "emd_sinkhorn_uniform")),
        ("ProtoNet - EMD, pre-trained backbone", ("pretrained", "protonet"),
         ("pretrained", "emd_sinkhorn_cross_reference")),
        ("exact - entropic EMD (same {exact} episodes)", ("emd_meta_exact_vs_sinkhorn", "emd_exact_cross_reference"),
         ("emd_meta_exact_vs_sinkhorn", "emd_sinkhorn_cross_reference"))],
    5: [("EMD merge (own backbone) - ProtoNet (own backbone)", ("emd_meta", "emd_sinkhorn_merge_cross_reference"),
         ("proto_meta", "protonet")),
        ("cross-reference - uniform weights (merge)", ("emd_meta", "emd_sinkhorn_merge_cross_reference"),
         ("emd_meta", "emd_sinkhorn_merge_uniform")),
        ("ProtoNet - EMD merge, pre-trained backbone", ("pretrained", "protonet"),
         ("pretrained", "emd_sinkhorn_merge_cross_reference")),
        ("structured FC - nearest neighbour (same {sfc} episodes)", ("emd_meta_sfc_comparison", "structured_fc"),
         ("emd_meta_sfc_comparison", "nearest_neighbour")),
        ("structured FC - merge (same {sfc} episodes)", ("emd_meta_sfc_comparison", "structured_fc"),
         ("emd_meta_sfc_comparison", "merge"))],
}


def runs(shots):
    """``{seed: results}`` of the ``shots``-shot runs found in ``RESULTS``."""
    return {seed: report["results"] for seed, report in seed_reports(f"emd_fewshot_{shots}shot").items()}


def percent_spread(values):
    """Mean and sample sd in percent."""
    return spread(100 * np.asarray(values, dtype=float))


def episode_count(results, backbone):
    """The episodes of ``backbone``'s classifiers, the same in every seed's run (else ``ValueError``)."""
    counts = {classifier["episodes"] for run in results.values() for classifier in run.get(backbone, {}).values()}
    if len(counts) > 1:
        raise ValueError(f"the runs scored {backbone!r} on different numbers of episodes: {sorted(counts)}")
    return counts.pop() if counts else None


def accuracies(results, seeds, backbone, classifier):
    """``classifier``'s mean accuracy on ``backbone`` in each seed's run, or ``None`` where a run did not score it."""
    if any(classifier not in results[s].get(backbone, {}) for s in seeds):
        return None
    return [results[s][backbone][classifier]["mean"] for s in seeds]


def summary(shots):
    results = runs(shots)
    seeds = list(results)
    if not seeds:
        print(f"{shots}-shot: no runs in {RESULTS}")
        return dict(seeds=[], rows=[], comparisons=[])
    counts = dict(sfc=episode_count(results, "emd_meta_sfc_comparison"),
                  exact=episode_count(results, "emd_meta_exact_vs_sinkhorn"))
    rows = []
    for label, backbone, classifier in ROWS[shots]:
        label = label.format(**counts)
        values = accuracies(results, seeds, backbone, classifier)
        if values is None:
            print(f"{shots}-shot: '{label}' left out: not scored in every seed's run")
            continue
        mean, sd = percent_spread(values)
        rows.append(dict(row=label, per_seed=[round(100 * v, 2) for v in values], mean=mean, sd=sd))
    comparisons = []
    for label, (b1, c1), (b2, c2) in COMPARISONS[shots]:
        label = label.format(**counts)
        first, second = accuracies(results, seeds, b1, c1), accuracies(results, seeds, b2, c2)
        if first is None or second is None:
            print(f"{shots}-shot: '{label}' left out: not scored in every seed's run")
            continue
        differences = [a - b for a, b in zip(first, second)]
        mean, sd = percent_spread(differences)
        comparisons.append(dict(comparison=label, per_seed=[round(100 * d, 2) for d in differences], mean=mean,
                                sd=sd, positive_in=f"{sum(d > 0 for d in differences)}/{len(differences)}"))
    return dict(seeds=seeds, rows=rows, comparisons=comparisons)


def main():
    report = {f"{shots}shot": summary(shots) for shots in (1, 5)}
    with open(os.path.join(RESULTS, "emd_fewshot_seeds.json"), "w") as handle:
        json.dump(report, handle, indent=2)
    for key, part in report.items():
        print(f"\n5-way {key[0]}-shot, seeds {part['seeds']}, accuracy % (mean +- sd over seeds):\n")
        print("| backbone | classifier | per seed | mean +- sd |\n| --- | --- | --- | --- |")
        for row in part["rows"]:
            print(f"| {row['row']} | {', '.join(f'{v:.2f}' for v in row['per_seed'])} | "
                  f"{row['mean']:.2f} +- {row['sd']:.2f} |")
        print("\n| difference (points) | per seed | mean +- sd | positive in |\n| --- | --- | --- | --- |")
        for row in part["comparisons"]:
            print(f"| {row['comparison']} | {', '.join(f'{v:+.2f}' for v in row['per_seed'])} | "
                  f"{row['mean']:+.2f} +- {row['sd']:.2f} | {row['positive_in']} |")


if __name__ == "__main__":
    main()
