"""A preset's recipe over several seeds: the packaged card (seed 0) next to re-runs with other seeds.

The presets are trained with one seed (0); whether one recipe beats another (MPW vs GAP classification, GSP vs GAP
retrieval) needs more. For each preset and seed this reads the card of that run -- the packaged one for seed 0
(``zoo.model_card``), ``RUNS/<preset>_seed<k>/metadata.json`` for the others, trained first with ``--train`` by
``training.recipes.train_preset(preset, dir, seed=k)`` (what ``otzoo train PRESET --seed k --out DIR`` runs; a killed
run resumes) -- and writes every run's metrics, training time and hardware, and each preset's mean and sample
standard deviation over its seeds.

    python experiments/preset_seeds.py --presets resnet20_mpw_fashion_mnist resnet20_gap_fashion_mnist \\
        --seeds 0 1 --output experiments/results/classification_presets_seeds.json [--train]
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from zoo.loading import model_card  # noqa: E402


def run_card(preset, seed, runs, train):
    """The card of ``preset`` trained with ``seed`` (the packaged one for seed 0)."""
    if seed == 0:
        return model_card(preset)
    out_dir = os.path.join(runs, f"{preset}_seed{seed}")
    path = os.path.join(out_dir, "metadata.json")
    if not os.path.isfile(path):
        if not train:
            raise SystemExit(f"no run of {preset} with seed {seed} at {out_dir}; pass --train to train it")
        from training.recipes import train_preset

        train_preset(preset, out_dir, seed=seed)
    with open(path) as handle:
        return json.load(handle)


def summary(values):
    values = np.asarray(values, dtype=float)
    return dict(mean=round(float(values.mean()), 4),
                std=round(float(values.std(ddof=1)), 4) if len(values) > 1 else None)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--runs", default="otzoo_runs", help="where the runs of seeds other than 0 live")
    parser.add_argument("--train", action="store_true", help="train the runs that are missing")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()

    runs, by_preset = [], {}
    for preset in args.presets:
        for seed in args.seeds:
            card = run_card(preset, seed, args.runs, args.train)
            metrics = {k: v for k, v in card["metrics"].items() if isinstance(v, (int, float))}
            runs.append(dict(preset=preset, seed=seed, metrics=metrics, packaged=seed == 0,
                             train_time_s=card.get("train_time_s"), hardware=card.get("hardware"),
                             command=card.get("command")))
            for key, value in metrics.items():
                by_preset.setdefault(preset, {}).setdefault(key, []).append(value)
    result = dict(seeds=args.seeds, command="python experiments/preset_seeds.py " + " ".join(sys.argv[1:]),
                  runs=runs, over_seeds={p: {k: summary(v) for k, v in m.items()} for p, m in by_preset.items()})
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump(result, handle, indent=2)
    print(json.dumps(result["over_seeds"], indent=2))


if __name__ == "__main__":
    main()
