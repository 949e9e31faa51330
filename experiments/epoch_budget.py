"""A training budget chosen on validation data, from one run per seed and variant scored after every epoch; the
shared part of the head comparisons ``mpw_vs_gap.py`` and ``gsp_vs_gap.py``.

With a constant learning rate a run stopped after ``E`` epochs is the same run as one of budget ``E``, so a run that
records its validation and test scores after every epoch covers the whole epoch grid. A variant's budget is the
epoch with the best mean validation score over the seeds (the smaller on a tie); the test scores are read at that
epoch only. Two variants run on the same seeds are compared paired by seed.

Also here: BatchNorm recalibration (every BatchNorm's moving statistics replaced by those of a set of training
images) for scoring a model as if its statistics were fresh, and the resumable JSON file the comparisons write.
"""
import json
import os

import keras
import numpy as np

from ot_layers.tensor_ops import walk_layers
from seed_runs import paired_differences, spread
from training.distributed.checkpoints import write_text_atomically


def recalibrate(model, images):
    """Sets every BatchNormalization's moving statistics to those of ``images``: one training-mode pass over all of
    them at once with momentum 0, so that each layer's statistics are taken on inputs normalized the same way."""
    norms = [layer for layer in walk_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    model(images, training=True)
    for layer, momentum in zip(norms, momenta):
        layer.momentum = momentum


def score_recalibrated(model, images, score):
    """``score()`` with ``model``'s BatchNorm recalibrated on ``images``; the model's non-trainable variables are put
    back afterwards, so that training goes on exactly as if it had not been scored."""
    kept = [keras.ops.convert_to_numpy(v) for v in model.non_trainable_variables]
    recalibrate(model, images)
    try:
        return score()
    finally:
        for variable, value in zip(model.non_trainable_variables, kept):
            variable.assign(value)


def chosen_epoch(runs, validation_key):
    """The epoch (1-based) with the best mean of the runs' per-epoch ``validation_key`` lists, the smaller on a
    tie."""
    mean = np.mean([r[validation_key] for r in runs], axis=0)
    return int(np.flatnonzero(mean == mean.max())[0]) + 1


def budget_comparison(runs, seeds, variant_key, variants, validation_key, test_key, also=()):
    """Each of the two ``variants`` (the values of ``r[variant_key]``) at its budget chosen on ``validation_key`` over
    ``seeds``: ``{variant: {"epochs", "test", "test_mean", "test_sd", "validation_mean"}}`` (``test``: the seeds'
    ``test_key`` scores at the budget; each key in ``also`` adds the seeds' scores of that key at the budget), and
    the paired difference of ``test``, first minus second (:func:`seed_runs.paired_differences`)."""
    runs = [r for r in runs if r["seed"] in seeds]
    summary = {}
    for variant in variants:
        own = [r for r in runs if r[variant_key] == variant]
        epoch = chosen_epoch(own, validation_key)
        by_seed = {r["seed"]: r for r in own}
        test = [by_seed[s][test_key][epoch - 1] for s in seeds]
        mean, sd = spread(test)
        summary[variant] = {"epochs": epoch, "test": test, "test_mean": mean, "test_sd": sd,
                            "validation_mean": spread([by_seed[s][validation_key][epoch - 1] for s in seeds])[0],
                            **{key: [by_seed[s][key][epoch - 1] for s in seeds] for key in also}}
    first, second = variants
    return summary, paired_differences(np.subtract(summary[first]["test"], summary[second]["test"]).tolist())


def print_comparison(mode, label, variants, seeds, difference, score=""):
    """Prints each variant's budget and test score over ``seeds`` (``variants``: ``{name: {"epochs",
    "validation_mean", "test_mean", "test_sd"}}``) and the paired ``difference`` (``label``, e.g. ``"MPW - GAP"``;
    ``difference``: ``{"mean", "sd", "ahead", "p"}`` with ``ahead`` as ``"3 of 5"``) of the scoring ``mode``;
    ``score`` names the score (`` MAP@R``)."""
    for name, result in variants.items():
        print(f"{mode}, {name}: budget {result['epochs']} epochs (validation{score} {result['validation_mean']:.4f}), "
              f"test{score} {result['test_mean']:.4f} +- {result['test_sd'] or 0:.4f} over seeds {seeds}")
    p_value = "" if difference["p"] is None else f", paired t-test p = {difference['p']:.3g}"
    print(f"{mode}, {label}: {difference['mean'] * 100:+.2f} +- {(difference['sd'] or 0) * 100:.2f} points{score} "
          f"({label.split()[0]} ahead in {difference['ahead']}{p_value})")


def complete_seeds(runs, variant_key, variants):
    """The seeds that have a run of every variant, sorted."""
    return sorted({r["seed"] for r in runs
                   if all(any(q[variant_key] == v and q["seed"] == r["seed"] for q in runs) for v in variants)})


def train_missing(runs, seeds, variant_key, variants, train_one, write):
    """Trains, seed by seed, every variant that ``runs`` holds no run of: ``train_one(variant, seed)`` returns the
    run, which is printed as one JSON line and appended to ``runs``; ``write(runs)`` then saves the report at once,
    so an interrupted call loses at most the run it was training. Returns the last report (``write(runs)`` once
    more when no run was missing)."""
    report = None
    for seed in seeds:
        for variant in variants:
            if any(r[variant_key] == variant and r["seed"] == seed for r in runs):
                continue
            runs.append(train_one(variant, seed))
            print(json.dumps(runs[-1]), flush=True)
            report = write(runs)
    return write(runs) if report is None else report


def add_run_arguments(parser, out, recalibration_images):
    """Adds the options every comparison takes: ``--seeds``, ``--recalibrate-bn N`` (``recalibration_images`` says
    which training images the ``N`` are) and ``--out`` (default ``out``)."""
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--recalibrate-bn", type=int, default=0, metavar="N",
                        help=f"also score every epoch with BatchNorm recalibrated on {recalibration_images} (0: do not)")
    parser.add_argument("--out", default=out, help="the JSON file of the runs; the runs it holds are not trained again")


def resumed_runs(parser, args, config):
    """The runs already in ``args.out`` for ``config``; ``config`` gains ``recalibrate_bn`` when it is set. Runs of
    another configuration there are a usage error of ``parser``."""
    if args.recalibrate_bn:
        config["recalibrate_bn"] = args.recalibrate_bn
    try:
        return recorded_runs(args.out, config)
    except ValueError as error:
        parser.error(str(error))


def recorded_runs(path, config):
    """The runs already in ``path`` (none when it does not exist). Raises ``ValueError`` when the file holds runs of
    another configuration."""
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        kept = json.load(handle)
    if kept.get("config") != config:
        raise ValueError(f"{path} holds runs of another configuration ({kept.get('config')}); choose another --out.")
    return kept["runs"]


def write_json(path, report):
    """Writes ``report`` to ``path`` atomically (a reader never sees half a file), creating its folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_text_atomically(path, json.dumps(report, indent=2))
