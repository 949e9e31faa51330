"""Does Generalized Sum Pooling beat global average pooling at retrieving unseen classes? A small-ConvNet comparison
on Fashion-MNIST, the budget chosen on validation data, over several seeds.

Both poolings get the recipe of ``gsp_fashion_mnist.py``: the same backbone (``zoo.small_convnet`` + a 1x1
convolution to 128-d local embeddings), loss (ProxyNCA++, temperature 0.1, on ``ClassProxies``), class-balanced
batches (5 classes x 16 images), optimizer (Adam 1e-3, constant) and seed; GSP adds its GAP warm-up epoch and
k-center prototype initialization. GSP: 64 prototypes, mu = 0.3, epsilon ``--epsilon`` (0.1, the retrieval preset's,
chosen there on held-out classes), at most 100 evaluations. Protocol:

- training: the first ``--train-per-class`` training-split images of each of the classes 0-4;
- validation: the first ``--validation-per-class`` training-split images of each of the unseen classes 5-9 (never
  trained on; Fashion-MNIST has too few classes to hold out validation classes apart from the test classes);
- test: the 5,000 test-split images of the classes 5-9.

An epoch here is ``--steps-per-epoch`` batches (75: 6,000 images, a fifth of the 30,000 training images), not a
pass over the data: retrieval of the unseen classes is at its best within the first passes (a run scored after
every full pass of 375 batches, ``experiments/results/gsp_vs_gap_full_passes_seed0.json``, peaked after 1 to 3
passes), so the grid is that much finer. GSP's GAP warm-up is the first such epoch; its prototypes are initialized
at that epoch's end, before it is scored, so GSP's first scores are those of GSP pooling on the warmed-up features.

Retrieval is cosine, each image a query against all others of its split. Each run trains ``--epochs`` epochs and
scores validation and test MAP@R and P@1 after every epoch; with a constant learning rate one run per pooling and
seed covers the epoch grid 1..``--epochs``. Each pooling's budget is the epoch with the best mean validation MAP@R
over the seeds (the smaller on a tie); the test split is never used to choose. Reported: test MAP@R (and P@1) at
that budget, mean and sample sd over seeds, and GSP minus GAP paired by seed with a paired t-test. With
``--recalibrate-bn N`` every epoch is also scored with BatchNorm recalibrated on ``N`` of the run's training images
(``epoch_budget.recalibrate``; training goes on unchanged), its budget chosen on its own validation scores.

Every finished run is written to ``--out`` at once; a later call with the same ``--out`` skips the runs it holds.
The recorded run (docs/results/gsp.md):

    python experiments/gsp_vs_gap.py --epochs 24 --seeds 0 1 2 3 4 --recalibrate-bn 2000 --out experiments/results/gsp_vs_gap_seeds.json

GSP's runs at other epsilons (``--variants gsp``, GAP does not depend on it) are compared with that report by
``gsp_epsilon_choice.py``, which chooses epsilon and budget together on validation data:

    python experiments/gsp_vs_gap.py --epochs 24 --seeds 0 1 2 3 4 --recalibrate-bn 2000 --epsilon 0.3 --variants gsp --out experiments/results/gsp_vs_gap_epsilon0.3.json

With ``--canvas C --clutter-pieces K`` every image of the three splits is a cluttered canvas (``cluttered_splits``):
the garment at a random position of a C x C canvas and K 8x8 crops of other garments over it, for asking whether
GSP's selection helps where the feature map has positions worth dropping; with ``--clutter-pieces 0`` the garments
are only moved, to the same positions (the positions are drawn before the clutter). The recorded runs (40x40
canvases, four pieces; GSP at epsilon 0.1 and, in reports of their own, 1.0 and 0.03; then the same canvases
without clutter):

    python experiments/gsp_vs_gap.py --epochs 24 --seeds 0 1 2 3 4 --recalibrate-bn 2000 --canvas 40 --clutter-pieces 4 --out experiments/results/gsp_vs_gap_clutter.json
    python experiments/gsp_vs_gap.py --epochs 24 --seeds 0 1 2 3 4 --recalibrate-bn 2000 --canvas 40 --clutter-pieces 4 --epsilon 1.0 --variants gsp --out experiments/results/gsp_vs_gap_clutter_epsilon1.0.json
    python experiments/gsp_vs_gap.py --epochs 24 --seeds 0 1 2 3 4 --recalibrate-bn 2000 --canvas 40 --clutter-pieces 4 --epsilon 0.03 --variants gsp --out experiments/results/gsp_vs_gap_clutter_epsilon0.03.json
    python experiments/gsp_vs_gap.py --epochs 24 --seeds 0 1 2 3 4 --recalibrate-bn 2000 --canvas 40 --clutter-pieces 0 --out experiments/results/gsp_vs_gap_translated.json

``experiments/results/gsp_vs_gap_full_passes_seed0.json`` (seed 0 of a call stopped after it, made by the first
version of this script, whose epoch was a full pass) holds the same protocol with ``--steps-per-epoch 375
--epochs 12``.
"""
import argparse
import os
import time

import keras
import numpy as np

from epoch_budget import (add_run_arguments, budget_comparison, complete_seeds, print_comparison, resumed_runs,
                          score_recalibrated, train_missing, write_json)
from gsp_fashion_mnist import GSP, TEST_CLASSES, TRAIN_CLASSES, build, first_per_class
from ot_layers.callbacks import GSPPrototypeInit
from ot_layers.losses import ProxyNCAPlusPlusLoss
from otzoo.arguments import non_negative_int, positive_int
from training.data.clutter import clutter
from training.data.fashion_mnist import load_fashion_mnist
from training.data.samplers import ClassBalancedBatches
from training.data.splits import select_classes
from training.evaluation.retrieval import retrieval_metrics

VARIANTS = ("gsp", "gap")  # compared first minus second
MODES = {"moving": "", "recalibrated": "recalibrated_"}  # scoring mode -> prefix of its score keys in a run
SCORES = ("map_at_r", "precision_at_1")  # the retrieval metrics recorded per epoch
SAMPLES_PER_CLASS = 16
IMAGE_SIZE = 28  # Fashion-MNIST's images, the smallest canvas
CLUTTER_PIECE_SIZE = 8  # Mnih et al. 2014's pieces of clutter


def load_splits(train_per_class, validation_per_class, canvas=IMAGE_SIZE, clutter_pieces=0):
    """``(train, validation, test)``, each ``(images, labels)`` with labels ``0..4``: training-split images of the
    classes 0-4, training-split images of the classes 5-9, and the test-split images of the classes 5-9; cluttered
    (:func:`cluttered_splits`) when :func:`is_cluttered`."""
    if not is_cluttered(canvas, clutter_pieces):
        return plain_splits(train_per_class, validation_per_class)
    return canvas_images(cluttered_splits(train_per_class, validation_per_class, canvas, clutter_pieces))


def is_cluttered(canvas, clutter_pieces):
    """Whether the splits are cluttered canvases (larger than 28 pixels, or with pieces of clutter) rather than
    Fashion-MNIST's own images."""
    return canvas != IMAGE_SIZE or clutter_pieces > 0


def canvas_images(splits):
    """The ``(images, labels)`` of each ``(ClutteredImages, labels)`` split of :func:`cluttered_splits`."""
    return tuple((cluttered.images, labels) for cluttered, labels in splits)


def plain_splits(train_per_class, validation_per_class):
    """:func:`load_splits`' three splits of 28x28 images."""
    images, labels = load_fashion_mnist("train")
    train = first_per_class(*select_classes(images, labels, TRAIN_CLASSES), train_per_class)
    validation = first_per_class(*select_classes(images, labels, TEST_CLASSES), validation_per_class)
    return train, validation, select_classes(*load_fashion_mnist("test"), TEST_CLASSES)


def cluttered_splits(train_per_class, validation_per_class, canvas, clutter_pieces):
    """:func:`load_splits`' three splits as ``(ClutteredImages, labels)``: each garment at a random position of a
    ``canvas`` x ``canvas`` canvas with ``clutter_pieces`` 8x8 crops of other garments of its own split (Mnih et al.
    2014's cluttered translated MNIST; ``training.data.clutter``). The draws are fixed per split (seeds 0, 1, 2),
    the same for every training seed and pooling, so runs pair on the same images."""
    return [(clutter(images, canvas, clutter_pieces, CLUTTER_PIECE_SIZE, seed=seed), labels)
            for seed, (images, labels) in enumerate(plain_splits(train_per_class, validation_per_class))]


class RetrievalScores(keras.callbacks.Callback):
    """Validation and test retrieval scores of ``embedding_model`` after every epoch (the test scores are recorded,
    never used to choose), with the moving statistics and, given ``recalibration_images``, with BatchNorm
    recalibrated on them."""

    def __init__(self, embedding_model, validation, test, seed, recalibration_images=None):
        super().__init__()
        self.embedding_model, self.validation, self.test, self.seed = embedding_model, validation, test, seed
        self.recalibration_images = recalibration_images
        prefixes = MODES.values() if recalibration_images is not None else [MODES["moving"]]
        self.scores = {f"{prefix}{split}_{key}": [] for prefix in prefixes for split in ("validation", "test")
                       for key in SCORES}

    def score(self, prefix):
        for split, (images, labels) in (("validation", self.validation), ("test", self.test)):
            embeddings = self.embedding_model.predict(images, batch_size=500, verbose=0)
            metrics = retrieval_metrics(embeddings, labels, metric="cosine", nmi=False, seed=self.seed)
            for key in SCORES:
                self.scores[f"{prefix}{split}_{key}"].append(float(metrics[key]))

    def on_epoch_end(self, epoch, logs=None):
        self.score(MODES["moving"])
        if self.recalibration_images is not None:
            score_recalibrated(self.model, self.recalibration_images, lambda: self.score(MODES["recalibrated"]))


def train_run(variant, seed, train, validation, test, epochs, steps_per_epoch, epsilon, recalibrate_bn=0):
    """One run of ``variant`` (``"gsp"`` or ``"gap"``) and ``seed``, scored after every epoch."""
    return train_model(variant, seed, train, validation, test, epochs, steps_per_epoch, epsilon, recalibrate_bn)[0]


def train_model(variant, seed, train, validation, test, epochs, steps_per_epoch, epsilon, recalibrate_bn=0):
    """``(run, embedding_model)``: :func:`train_run`'s run and the embedding model it trained."""
    x_train, y_train = train
    keras.utils.set_random_seed(seed)
    model, embedding_model, _ = build(variant, len(TRAIN_CLASSES), gsp=dict(GSP, epsilon=epsilon),
                                      input_shape=x_train.shape[1:])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=ProxyNCAPlusPlusLoss(temperature=0.1))
    batches = ClassBalancedBatches(x_train, y_train, classes_per_batch=len(TRAIN_CLASSES),
                                   samples_per_class=SAMPLES_PER_CLASS,
                                   steps_per_epoch=steps_per_epoch, seed=seed)
    recalibration_images = None
    if recalibrate_bn:
        recalibration_images = x_train[np.random.default_rng(seed).permutation(len(x_train))[:recalibrate_bn]]
    scores = RetrievalScores(embedding_model, validation, test, seed, recalibration_images)
    callbacks = [scores]
    if variant == "gsp":
        callbacks.insert(0, GSPPrototypeInit(x_train[:256], layer_name="gsp", warmup_epochs=1, num_features=1024,
                                             seed=seed))
    start = time.time()
    history = model.fit(batches, epochs=epochs, verbose=2, callbacks=callbacks)
    return {"variant": variant, "seed": seed, **scores.scores,
            "train_loss": [float(v) for v in history.history["loss"]], "seconds": time.time() - start,
            "parameters": model.count_params()}, embedding_model


def summarize(runs, seeds, prefix=""):
    """Each pooling's budget (on the ``prefix``ed validation MAP@R: ``MODES``) and its test scores there over
    ``seeds``, and the paired GSP - GAP difference of test MAP@R."""
    poolings, difference = budget_comparison(runs, seeds, "variant", VARIANTS, prefix + "validation_map_at_r",
                                             prefix + "test_map_at_r", also=[prefix + "test_precision_at_1"])
    for summary in poolings.values():
        summary["test_precision_at_1"] = summary.pop(prefix + "test_precision_at_1")
        summary["test_precision_at_1_mean"] = float(np.mean(summary["test_precision_at_1"]))
    return {"poolings": poolings, "gsp_minus_gap": difference}


def write_report(path, config, runs):
    """Writes the runs and, over the seeds both poolings finished, the summaries to ``path`` (atomically)."""
    report = {"config": config, "runs": runs}
    seeds = complete_seeds(runs, "variant", VARIANTS)
    if seeds:
        report["seeds"] = seeds
        report["summary"] = {mode: summarize(runs, seeds, prefix) for mode, prefix in MODES.items()
                             if mode == "moving" or config.get("recalibrate_bn")}
    write_json(path, report)
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=positive_int, default=24, help="the largest budget of the epoch grid")
    parser.add_argument("--steps-per-epoch", type=positive_int, default=75,
                        help="batches of 5 classes x 16 images an epoch (at most one pass over the training images)")
    parser.add_argument("--train-per-class", type=positive_int, default=6000,
                        help="training images of each class 0-4 (at most 6000)")
    parser.add_argument("--validation-per-class", type=positive_int, default=1000,
                        help="validation images of each unseen class 5-9, from the training split (at most 6000)")
    parser.add_argument("--epsilon", type=float, default=0.1, help="GSP's entropic regularization")
    parser.add_argument("--canvas", type=positive_int, default=IMAGE_SIZE,
                        help="side of the canvas each garment is placed on at a random position (28: as it is)")
    parser.add_argument("--clutter-pieces", type=non_negative_int, default=0,
                        help="8x8 crops of other garments scattered over each canvas (Mnih et al. 2014's clutter)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="the poolings to train (the summary needs both; GSP alone for another --epsilon, whose "
                             "runs gsp_epsilon_choice.py compares with the GAP runs of a full call)")
    add_run_arguments(parser, os.path.join(os.path.dirname(__file__), "results", "gsp_vs_gap_seeds.json"),
                      "N of the run's training images, drawn by its seed")
    args = parser.parse_args()
    for name in ("train_per_class", "validation_per_class"):
        if getattr(args, name) > 6000:
            parser.error(f"--{name.replace('_', '-')} must be at most 6000 (Fashion-MNIST's training images per "
                         f"class), got {getattr(args, name)}.")
    one_pass = 5 * args.train_per_class // (len(TRAIN_CLASSES) * SAMPLES_PER_CLASS)
    if args.steps_per_epoch > one_pass:
        parser.error(f"--steps-per-epoch must be at most {one_pass} (one pass over the training images), "
                     f"got {args.steps_per_epoch}.")
    if args.canvas < IMAGE_SIZE:
        parser.error(f"--canvas must be at least Fashion-MNIST's {IMAGE_SIZE} pixels, got {args.canvas}.")
    if not args.epsilon > 0:
        parser.error(f"--epsilon must be positive, got {args.epsilon}.")
    if not 0 <= args.recalibrate_bn <= 5 * args.train_per_class:
        parser.error(f"--recalibrate-bn must be between 0 and the {5 * args.train_per_class} training images, "
                     f"got {args.recalibrate_bn}.")
    config = {key: getattr(args, key)
              for key in ("epochs", "steps_per_epoch", "train_per_class", "validation_per_class", "epsilon")}
    if is_cluttered(args.canvas, args.clutter_pieces):  # recorded when set (the plain reports predate them)
        config.update(canvas=args.canvas, clutter_pieces=args.clutter_pieces)
    runs = resumed_runs(parser, args, config)
    train, validation, test = load_splits(args.train_per_class, args.validation_per_class, args.canvas,
                                          args.clutter_pieces)
    report = train_missing(
        runs, args.seeds, "variant", [v for v in VARIANTS if v in args.variants],
        lambda variant, seed: train_run(variant, seed, train, validation, test, args.epochs, args.steps_per_epoch,
                                        args.epsilon, args.recalibrate_bn),
        lambda runs: write_report(args.out, config, runs))
    for mode, summary in report.get("summary", {}).items():
        paired = summary["gsp_minus_gap"]
        ahead, seeds = paired["positive_in"].split("/")
        print_comparison(mode, "GSP - GAP", summary["poolings"], report["seeds"],
                         {"mean": paired["mean"], "sd": paired["sd"], "p": paired["paired_t_p"],
                          "ahead": f"{ahead} of {seeds}"}, score=" MAP@R")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
