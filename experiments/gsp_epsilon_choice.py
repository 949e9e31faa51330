"""GSP's entropic regularization epsilon chosen on validation data, jointly with the training budget, and the chosen
GSP compared with global average pooling: the epsilon grid of ``gsp_vs_gap.py``.

``gsp_vs_gap.py`` trains GSP at one epsilon. Its runs at other epsilons (``--variants gsp --epsilon E``, each into a
file of its own) go into this comparison with a report that holds both poolings; every report must have the same
configuration apart from epsilon, and the seeds compared are those every report holds a GSP run of (and the first
report that holds GAP runs, a GAP run of). For each epsilon, GSP's budget is the epoch of its best mean validation
MAP@R over those seeds; the chosen epsilon is the one whose best is highest (the first listed on a tie), so the
epsilon and the epoch are chosen together on validation data alone. The test MAP@R is then read at the chosen
epsilon and budget, and compared with GAP's at its own budget, paired by seed. Each epsilon's test scores and its
difference from GAP are reported too, for reading, never for choosing. Done for the moving BatchNorm statistics and,
when the runs were scored so, for the recalibrated ones (each with its own choice).

The recorded comparisons (docs/results/gsp.md), on the plain images, on cluttered canvases and on the same canvases
without clutter (one epsilon: the budget chosen, and the report the selectivity measurement reads):

    python experiments/gsp_epsilon_choice.py experiments/results/gsp_vs_gap_seeds.json experiments/results/gsp_vs_gap_epsilon0.3.json experiments/results/gsp_vs_gap_epsilon1.0.json experiments/results/gsp_vs_gap_epsilon3.0.json experiments/results/gsp_vs_gap_epsilon10.0.json --out experiments/results/gsp_vs_gap_epsilon_choice.json
    python experiments/gsp_epsilon_choice.py experiments/results/gsp_vs_gap_clutter.json experiments/results/gsp_vs_gap_clutter_epsilon1.0.json experiments/results/gsp_vs_gap_clutter_epsilon0.03.json --out experiments/results/gsp_vs_gap_clutter_epsilon_choice.json
    python experiments/gsp_epsilon_choice.py experiments/results/gsp_vs_gap_translated.json --out experiments/results/gsp_vs_gap_translated_epsilon_choice.json
"""
import argparse
import json
import os

import numpy as np

from epoch_budget import budget_comparison, complete_seeds, print_comparison, write_json
from gsp_vs_gap import MODES


def read_reports(paths):
    """``(config, runs)`` of the ``gsp_vs_gap.py`` reports at ``paths``: the configuration they share apart from
    epsilon, and their GSP runs with ``"setting"`` set to their epsilon, plus the GAP runs (``"setting"``
    ``"gap"``) of the first report that holds any. Raises ``ValueError`` naming the file that does not fit."""
    shared, runs, epsilons, gap_from = None, [], set(), None
    for path in paths:
        with open(path) as handle:
            report = json.load(handle)
        config = dict(report.get("config") or {})
        if "epsilon" not in config or "runs" not in report:
            raise ValueError(f"{path} is not a report of gsp_vs_gap.py (no config epsilon or runs).")
        epsilon = config.pop("epsilon")
        if shared is None:
            shared = config
        elif config != shared:
            raise ValueError(f"{path} holds runs of another configuration than {paths[0]} apart from epsilon "
                             f"({config} against {shared}).")
        if epsilon in epsilons:
            raise ValueError(f"{path} repeats epsilon {epsilon} of an earlier report.")
        epsilons.add(epsilon)
        runs += [dict(r, setting=epsilon) for r in report["runs"] if r["variant"] == "gsp"]
        if gap_from is None and any(r["variant"] == "gap" for r in report["runs"]):
            gap_from = path
            runs += [dict(r, setting="gap") for r in report["runs"] if r["variant"] == "gap"]
    if gap_from is None:
        raise ValueError("none of the reports holds GAP runs; give the report of a call that trained both poolings.")
    return shared, runs


def choose(runs, seeds, prefix=""):
    """For the scoring mode of ``prefix`` (``MODES``): each epsilon's budget, validation and test scores (MAP@R,
    and the mean test P@1) and its paired difference from GAP; the epsilon of the best mean validation MAP@R; and
    GSP there against GAP."""
    epsilons = [r["setting"] for r in runs if r["setting"] != "gap"]
    epsilons = sorted(set(epsilons), key=epsilons.index)
    by_epsilon = {}
    for epsilon in epsilons:
        poolings, difference = budget_comparison(runs, seeds, "setting", (epsilon, "gap"),
                                                 prefix + "validation_map_at_r", prefix + "test_map_at_r",
                                                 also=[prefix + "test_precision_at_1"])
        for summary in poolings.values():
            summary["test_precision_at_1_mean"] = float(np.mean(summary.pop(prefix + "test_precision_at_1")))
        by_epsilon[epsilon] = {"gsp": poolings[epsilon], "gap": poolings["gap"], "gsp_minus_gap": difference}
    chosen = max(epsilons, key=lambda e: (by_epsilon[e]["gsp"]["validation_mean"], -epsilons.index(e)))
    return {"epsilons": [{"epsilon": e, **{k: v for k, v in by_epsilon[e].items() if k != "gap"}} for e in epsilons],
            "chosen_epsilon": chosen,
            "poolings": {"gsp": by_epsilon[chosen]["gsp"], "gap": by_epsilon[chosen]["gap"]},
            "gsp_minus_gap": by_epsilon[chosen]["gsp_minus_gap"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reports", nargs="+",
                        help="gsp_vs_gap.py reports at different epsilons, one of them with GAP runs")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "gsp_vs_gap_epsilon_choice.json"),
                        help="the JSON file of the comparison")
    args = parser.parse_args()
    missing = [path for path in args.reports if not os.path.isfile(path)]
    if missing:
        parser.error(f"reports: no such file: {', '.join(missing)}")
    try:
        config, runs = read_reports(args.reports)
    except ValueError as error:
        parser.error(f"reports: {error}")
    seeds = complete_seeds(runs, "setting", {r["setting"] for r in runs})
    if not seeds:
        parser.error("reports: no seed has a run at every epsilon and a GAP run.")
    modes = {mode: prefix for mode, prefix in MODES.items() if mode == "moving" or config.get("recalibrate_bn")}
    summary = {mode: choose(runs, seeds, prefix) for mode, prefix in modes.items()}
    write_json(args.out, {"reports": args.reports, "config": config, "seeds": seeds, "summary": summary})
    for mode, result in summary.items():
        for row in result["epsilons"]:
            paired = row["gsp_minus_gap"]
            print(f"{mode}, GSP at epsilon {row['epsilon']}: budget {row['gsp']['epochs']} epochs, validation MAP@R "
                  f"{row['gsp']['validation_mean']:.4f}, test {row['gsp']['test_mean']:.4f}, GSP - GAP "
                  f"{paired['mean'] * 100:+.2f} points")
        paired = result["gsp_minus_gap"]
        ahead, count = paired["positive_in"].split("/")
        print(f"{mode}: chosen epsilon {result['chosen_epsilon']}")
        print_comparison(mode, "GSP - GAP", result["poolings"], seeds,
                         {"mean": paired["mean"], "sd": paired["sd"], "p": paired["paired_t_p"],
                          "ahead": f"{ahead} of {count}"}, score=" MAP@R")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
