"""Does the Multi-Proxy Wasserstein head beat global average pooling + Dense? A small-ConvNet comparison on
Fashion-MNIST, the budget chosen on validation data, over several seeds.

Both heads get the same backbone (``small_convnet``, BatchNorm momentum 0.9, unnormalized images:
``zoo_inputs.RAW_PIXELS``), seed, data order, optimizer (Adam 1e-3, constant), batch size (64) and epoch grid. The
models are ``zoo.image_classifier`` with heads ``gap_fc`` and ``mpw``. Protocol:

- training images: the first ``--train`` of the training split; validation: its last ``--validation`` images
  (disjoint from them); test: the full 10k test split.
- each run trains ``--epochs`` epochs and scores validation and test accuracy after every epoch. With a constant
  learning rate a run stopped after ``E`` epochs is the same run as one of budget ``E``, so one run per head and seed
  covers the whole epoch grid 1..``--epochs``.
- each head's budget is the epoch with the best mean validation accuracy over the seeds (the smaller on a tie);
  the test split is never used to choose. Reported: test accuracy at that budget, mean and sample sd over seeds,
  and MPW minus GAP paired by seed (same seed and data order), with a paired t-test
  (``scipy.stats.ttest_rel``).

With ``--recalibrate-bn N`` every epoch is also scored after recalibrating BatchNorm: each BatchNorm's moving
statistics are replaced by those of the run's first ``N`` training images (one training-mode pass, momentum 0), both
splits are scored, and the moving statistics are put back, so training goes on exactly as without the option. The
budget of the recalibrated scores is chosen on their own validation accuracy, the same way.

Every finished run is written to ``--out`` at once (a later call with the same ``--out`` skips the runs it holds),
so an interrupted comparison resumes. The recorded runs (docs/results/sinkhorn_mpw.md):

    python experiments/mpw_vs_gap.py --epochs 8 --seeds 0 1 2 3 4 --out experiments/results/mpw_vs_gap_seeds.json
    python experiments/mpw_vs_gap.py --epochs 8 --seeds 0 1 2 3 4 --recalibrate-bn 2000 --out experiments/results/mpw_vs_gap_recalibrated.json
    python experiments/mpw_vs_gap.py --epochs 24 --seeds 0 1 2 3 4 --recalibrate-bn 2000 --out experiments/results/mpw_vs_gap_24_epochs_recalibrated.json
"""
import argparse
import os
import time

import keras
import numpy as np

import zoo
from training.recipes.simple_classifier import compile_classifier
from training.data.fashion_mnist import load_fashion_mnist
from zoo_inputs import small_convnet_options
from otzoo.arguments import positive_int
from epoch_budget import (add_run_arguments, budget_comparison, complete_seeds, print_comparison, resumed_runs,
                          score_recalibrated, train_missing, write_json)

ZOO_HEADS = {"gap": "gap_fc", "mpw": "mpw"}  # this experiment's head names -> zoo.image_classifier's
TRAINING_IMAGES = 60000  # Fashion-MNIST's training split
MODES = {"moving": "", "recalibrated": "recalibrated_"}  # scoring mode -> prefix of its accuracy keys in a run


class EpochScores(keras.callbacks.Callback):
    """Validation and test accuracy after every epoch (the test scores are recorded, never used to choose), with the
    moving statistics and, given ``recalibration_images``, after recalibrating BatchNorm on them (the model's
    non-trainable variables are restored afterwards)."""

    def __init__(self, validation, test, recalibration_images=None):
        super().__init__()
        self.validation, self.test = validation, test
        self.recalibration_images = recalibration_images
        prefixes = MODES.values() if recalibration_images is not None else [MODES["moving"]]
        self.scores = {f"{prefix}{split}_accuracy": [] for prefix in prefixes for split in ("validation", "test")}

    def score(self, prefix):
        for split, data in (("validation", self.validation), ("test", self.test)):
            _, accuracy = self.model.evaluate(*data, batch_size=256, verbose=0)
            self.scores[f"{prefix}{split}_accuracy"].append(float(accuracy))

    def on_epoch_end(self, epoch, logs=None):
        self.score(MODES["moving"])
        if self.recalibration_images is not None:
            score_recalibrated(self.model, self.recalibration_images, lambda: self.score(MODES["recalibrated"]))


def build_model(head, seed, width, bn_momentum=0.9):
    """The compiled ``small_convnet`` classifier with ``head``, its weights drawn from ``seed``."""
    keras.utils.set_random_seed(seed)
    return compile_classifier(zoo.image_classifier("small_convnet", ZOO_HEADS[head], 10,
                                                   **small_convnet_options(width, feature_dim=64,
                                                                           bn_momentum=bn_momentum)))


def load_splits(train, validation):
    """Training images (the first ``train`` of the training split) and validation images (its last
    ``validation``), each ``(images, labels)``."""
    x, y = load_fashion_mnist("train")
    return (x[:train], y[:train]), (x[-validation:], y[-validation:])


def data_order(seed, count):
    """The order a run of ``seed`` feeds its ``count`` training images in."""
    return np.random.default_rng(seed).permutation(count)


def train_run(head, seed, train, validation, test, epochs, width, recalibrate_bn=0):
    model = build_model(head, seed, width)
    x_train, y_train = train
    order = data_order(seed, len(x_train))
    scores = EpochScores(validation, test, x_train[order[:recalibrate_bn]] if recalibrate_bn else None)
    start = time.time()
    history = model.fit(x_train[order], y_train[order], epochs=epochs, batch_size=64, shuffle=True, verbose=2,
                        callbacks=[scores])
    return {"head": head, "seed": seed, **scores.scores, "train_loss": [float(v) for v in history.history["loss"]],
            "seconds": time.time() - start, "parameters": model.count_params()}


def summarize(runs, seeds, prefix=""):
    """Each head's budget and test accuracy at it over ``seeds`` (the ``prefix``ed scores: ``MODES``), and the
    paired MPW - GAP difference."""
    heads, difference = budget_comparison(runs, seeds, "head", ("mpw", "gap"), prefix + "validation_accuracy",
                                          prefix + "test_accuracy")
    summary = {head: {"epochs": heads[head]["epochs"], "test_accuracy": heads[head]["test"],
                      **{key: heads[head][key] for key in ("test_mean", "test_sd", "validation_mean")}}
               for head in ZOO_HEADS}
    paired = {"mpw_minus_gap": difference["per_seed"], "mean": difference["mean"], "sd": difference["sd"],
              "mpw_ahead_in": int(difference["positive_in"].split("/")[0]), "seeds": len(seeds),
              "ttest_rel_p": difference["paired_t_p"]}
    return summary, paired


def write_report(path, config, runs):
    """Writes the runs and, over the seeds both heads finished, the summary to ``path`` (atomically)."""
    report = {"config": config, "runs": runs}
    seeds = complete_seeds(runs, "head", ZOO_HEADS)
    if seeds:
        report["seeds"] = seeds
        report["heads"], report["paired"] = summarize(runs, seeds)
        if config.get("recalibrate_bn"):
            heads, paired = summarize(runs, seeds, MODES["recalibrated"])
            report["recalibrated"] = {"heads": heads, "paired": paired}
    write_json(path, report)
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=positive_int, default=8, help="the largest budget of the epoch grid")
    parser.add_argument("--train", type=positive_int, default=15000, help="training images (the first N)")
    parser.add_argument("--validation", type=positive_int, default=5000,
                        help="validation images (the last N of the training split)")
    parser.add_argument("--width", type=positive_int, default=32)
    add_run_arguments(parser, os.path.join(os.path.dirname(__file__), "results", "mpw_vs_gap_seeds.json"),
                      "the run's first N training images")
    args = parser.parse_args()
    if args.train + args.validation > TRAINING_IMAGES:
        parser.error(f"--train plus --validation must not exceed the {TRAINING_IMAGES} training images "
                     f"(got {args.train} + {args.validation}).")

    if not 0 <= args.recalibrate_bn <= args.train:
        parser.error(f"--recalibrate-bn must be between 0 and --train ({args.train}), got {args.recalibrate_bn}.")
    config = {"epochs": args.epochs, "train": args.train, "validation": args.validation, "width": args.width}
    runs = resumed_runs(parser, args, config)
    train, validation = load_splits(args.train, args.validation)
    test = load_fashion_mnist("test")
    report = train_missing(
        runs, args.seeds, "head", ZOO_HEADS,
        lambda head, seed: train_run(head, seed, train, validation, test, args.epochs, args.width, args.recalibrate_bn),
        lambda runs: write_report(args.out, config, runs))
    if "seeds" not in report:
        return
    summaries = {"moving statistics": report}
    if "recalibrated" in report:
        summaries["BatchNorm recalibrated"] = report["recalibrated"]
    for mode, summary in summaries.items():
        paired = summary["paired"]
        print_comparison(mode, "MPW - GAP", summary["heads"], report["seeds"],
                         {"mean": paired["mean"], "sd": paired["sd"], "p": paired["ttest_rel_p"],
                          "ahead": f"{paired['mpw_ahead_in']} of {paired['seeds']}"})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
