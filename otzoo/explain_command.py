"""The ``otzoo explain`` sub-command: the pictures that fit a preset, for image files or Fashion-MNIST test images.

Registered by ``otzoo.cli``. The work is :func:`explain.report.explain_model`; this module
turns the command line into its inputs (images fitted to the model's input, labels, a retrieval gallery, a
few-shot episode per query, the preset's training log) and prints what was written.
"""
import argparse
import os
import re

import numpy as np

import zoo
from explain.images import load_image_file, model_input_shape, prepare_images
from explain.plots import MAX_DPI
from explain.report import KINDS, available_kinds, explain_model, why_not
from explain.signals import FASHION_MNIST_CLASSES, read_training_log
from ot_layers.layers.task_layers import SupportClassMeans
from ot_layers.tensor_ops import find_layer
from otzoo.arguments import (
    CommandError,
    directory_preset,
    non_negative_int,
    output_directory,
    positive_int,
    preset_or_directory,
    seed_value,
    weights_location,
)
from training.data.fashion_mnist import load_fashion_mnist
from training.recipes.common import card_base_preset
from zoo.loading import preset_dir
from zoo.preset_format import read_card, weights_directory
from zoo.registry import PRESETS

LOG_FILES = ("train_log.csv", "log.csv")  # a packaged preset's training log; an `otzoo train` run's

DESCRIPTION = """\
Draw what the layers of a preset do on images and write the pictures as PNG files into --out, printing each path.
The pictures that fit the preset are drawn (or only those named by --kinds):

  mpw         MultiProxyWasserstein transport plans (cells x proxies) over the image, for the predicted and the
              true class (or the runner-up when the label is unknown): one PNG per image
  gsp         GeneralizedSumPooling weights over each image (retrieval presets with GSP pooling): one PNG
  emd         EMD flows and cross-reference node weights between each query and the support image of its class
              and of the best other class, in a 1-shot episode drawn from the Fashion-MNIST test split (from the
              preset's evaluation classes when the query is one of them; few-shot presets): two PNGs per image
  prototypes  the hyperspherical prototypes' cosine matrix and class fit (hyperspherical presets): one PNG
  retrieval   each image and its --top-k nearest neighbours among the first --gallery-size Fashion-MNIST test
              images (of the preset's evaluation classes when it has some; embedding presets: their embeddings;
              classifiers: the pooled backbone features), framed green when of the query's class, red
              otherwise: one PNG
  curves      the training curves of the weights explained: the preset's train_log.csv, or with --weights the
              log beside them (a preset directory's train_log.csv, an `otzoo train` run's log.csv): one PNG;
              for a few-shot preset also its card's meta-training curves (loss, query accuracy and the EMD
              head's solver signals by episode): meta_training.png

Images are PNG/JPEG files (converted to the model's input size and channels; Fashion-MNIST items are light on a
black background) or Fashion-MNIST test images by index (their labels are then known). With neither,
--test-index 0 is used."""


def dpi_value(text):
    """An ``argparse`` type: the PNGs' resolution, an integer in ``1 .. MAX_DPI``."""
    value = positive_int(text)
    if value > MAX_DPI:
        raise argparse.ArgumentTypeError(f"must be an integer <= {MAX_DPI}, got {text!r}")
    return value


def register(commands, parser_class):
    """Add ``explain`` to the ``otzoo`` sub-commands (see ``otzoo.cli``)."""

    sub = commands.add_parser("explain", help="draw what a preset's layers do on images (PNG files)",
                              description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub.add_argument("preset", type=preset_or_directory, metavar="PRESET",
                     help="a preset name (see `otzoo list`) or a preset directory (a training or fine-tuning run: "
                          "its weights, log and card, drawn as the preset its card names)")
    sub.add_argument("images", nargs="*", metavar="IMAGE", help="image files (PNG, JPEG) to explain")
    sub.add_argument("--test-index", nargs="+", action=IndicesThenImages, default=[], metavar="N",
                     help="Fashion-MNIST test images to explain, by index (0-9999); repeatable. Image files may "
                          "follow the indices")
    sub.add_argument("--out", required=True, type=output_directory,
                     help="folder the PNG files are written into (created if needed)")
    sub.add_argument("--kinds", nargs="+", choices=KINDS, default=None, metavar="KIND",
                     help=f"draw only these kinds ({', '.join(KINDS)}; a kind named twice is drawn once); "
                          "default: every kind that fits the preset")
    sub.add_argument("--weights", type=weights_location, default=None,
                     help="with a preset name: a weights file or preset directory instead of the packaged weights")
    sub.add_argument("--top-k", type=positive_int, default=5, help="neighbours in the retrieval panel (default 5)")
    sub.add_argument("--gallery-size", type=positive_int, default=1000,
                     help="the retrieval gallery: the first N Fashion-MNIST test images (of the preset's "
                          "evaluation classes, if any; default 1000)")
    sub.add_argument("--seed", type=seed_value, default=0,
                     help="chooses the few-shot episode's support images (default 0)")
    sub.add_argument("--dpi", type=dpi_value, default=100,
                     help=f"resolution of the PNG files, at most {MAX_DPI} (default 100)")
    sub.set_defaults(run=run)
    return sub


def training_records(preset, weights=None):
    """What the weights ``otzoo explain`` draws were trained with, from their directory (the packaged preset's, or
    with ``weights`` (``--weights``) theirs, ``zoo.preset_format.weights_directory``; never the packaged preset's,
    whose log and card are those of other weights): ``(log, meta_training)``, the path of its ``train_log.csv`` (a
    packaged preset's), else of its ``log.csv`` (an ``otzoo train`` run's), and its card's episodic
    ``meta_training`` history (a few-shot run's: loss, query accuracy and EMD signals by episode); ``None`` where
    there is none (a lone weights file or a URL has neither)."""
    folder = preset_dir(preset) if weights is None else weights_directory(weights)
    if folder is None:
        return None, None
    log = next((path for path in (os.path.join(folder, name) for name in LOG_FILES) if os.path.isfile(path)), None)
    return log, (read_card(folder) or {}).get("meta_training") or None


def trained_head(preset, weights=None):
    """The head (retrieval: pooling) arguments the weights ``otzoo explain`` draws were trained with in place of the
    preset's: the ``head_overrides`` of their directory's card (``zoo.preset_format.weights_directory``), which a
    run of ``otzoo train --config`` with a tuned configuration (``otzoo tune``'s ``best.json``) records; ``{}`` for
    the packaged weights, a weights file without a card, a URL, or a card of another preset. The model is built
    with them, as the run built it: with the preset's own head, a tuned run's weights (e.g. 2 proxies per class
    instead of 4) did not load."""
    folder = None if weights is None else weights_directory(weights)
    card = (read_card(folder) or {}) if folder is not None else {}
    overrides = card.get("head_overrides")
    try:  # the preset the card comes from: its name, or a fine-tuned run's base
        base = card_base_preset(card)
    except ValueError:
        return {}
    if base != preset or not isinstance(overrides, dict):
        return {}
    return dict(overrides)


class IndicesThenImages(argparse.Action):
    """``--test-index N [N ...] [IMAGE ...]``: the leading integers are test indices, what follows them is image
    files (``nargs="+"`` would otherwise read ``--test-index 3 shirt.png`` as two indices and refuse the second).

    The images are kept in ``images_after_options`` and joined to the positional ``IMAGE`` list by :func:`run`."""

    def __call__(self, parser, namespace, values, option_string=None):
        count = 0
        while count < len(values) and re.fullmatch(r"[+-]?\d+", values[count].strip()):
            count += 1
        if count == 0:
            parser.error(f"argument {option_string}: must be an integer >= 0, got {values[0]!r}")
        indices = []
        for text in values[:count]:
            try:
                indices.append(non_negative_int(text))
            except argparse.ArgumentTypeError as error:
                parser.error(f"argument {option_string}: {error}")
        setattr(namespace, self.dest, list(getattr(namespace, self.dest, None) or []) + indices)
        trailing = list(getattr(namespace, "images_after_options", None) or [])
        setattr(namespace, "images_after_options", trailing + list(values[count:]))


def _stem(path):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.splitext(os.path.basename(path))[0]) or "image"


def _inputs(args, input_shape, x_test, y_test):
    """Images, labels, file-name stems and test indices (-1 for files) of the command line."""

    images, labels, names, indices = [], [], [], []
    for path in args.images:
        try:  # a file that is no image, or one the model's input cannot take: the user's input
            images.append(load_image_file(path, input_shape))
        except (ValueError, FileNotFoundError) as error:
            raise CommandError(str(error)) from None
        labels.append(None)
        names.append(_stem(path))
        indices.append(-1)
    for index in args.test_index:
        images.append(prepare_images(x_test[index], input_shape)[0])
        labels.append(int(y_test[index]))
        names.append(f"test{index:05d}")
        indices.append(index)
    return images, labels, _distinct(names), indices


def _distinct(names):
    """File-name stems made distinct (``shoe``, ``shoe_1``, ...): two images of one stem would write one file."""
    seen, out = set(), []
    for name in names:
        unique, n = name, 0
        while unique in seen:
            n += 1
            unique = f"{name}_{n}"
        seen.add(unique)
        out.append(unique)
    return out


def _episode(model, label, query_index, y_test, seed, pool=None):
    """A 1-shot episode for one query: ``ways`` classes from ``pool`` (the preset's evaluation classes, else every
    class), starting at the query's class when it is in the pool and going on cyclically (from the pool's first
    class for an unknown label), one support image each drawn from the test split (never the query).

    Returns the episode's classes (sorted), the support images' test indices, their episode labels and the
    query's episode label (``None`` when unknown)."""


    ways = find_layer(model, SupportClassMeans).ways
    everything = sorted(int(c) for c in np.unique(y_test))
    pool = sorted(int(c) for c in pool) if pool and (label is None or label in pool) else everything
    if ways > len(pool):
        raise CommandError(f"preset: a {ways}-way model needs {ways} classes, the test split offers {len(pool)}.")
    start = 0 if label is None else pool.index(label)
    classes = sorted(pool[(start + i) % len(pool)] for i in range(ways))
    rng = np.random.default_rng(seed)
    support = []
    for cls in classes:
        members = np.flatnonzero((y_test == cls) & (np.arange(len(y_test)) != query_index))
        support.append(int(rng.choice(members)))
    episode_label = None if label is None else classes.index(label)
    return classes, np.asarray(support), np.arange(ways, dtype=np.int32), episode_label


def _gallery(y_test, size, pool=None):
    """Test indices of the retrieval gallery: the first ``size`` test images (of the ``pool`` classes, the
    preset's evaluation classes, when given)."""

    candidates = np.flatnonzero(np.isin(y_test, pool)) if pool else np.arange(len(y_test))
    return candidates[:size]


def run(args):
    """Validate the input, load the preset and write its pictures."""

    directory, card = None, None
    if args.preset not in PRESETS:  # a preset directory: drawn as the built-in preset its card comes from
        if args.weights is not None:
            raise CommandError("--weights: a preset directory is explained with its own weights; give a preset name "
                               "with --weights, or the directory alone.")
        directory, args.weights = args.preset, args.preset
        card = read_card(directory)  # the weights' own card (preset_or_directory: it holds one)
        args.preset = directory_preset(directory, card)
    args.images = list(args.images) + list(getattr(args, "images_after_options", None) or [])
    for path in args.images:
        if not os.path.isfile(path):
            raise CommandError(f"IMAGE: no image file at {path!r}")
    if not args.images and not args.test_index:
        args.test_index = [0]
    x_test, y_test = load_fashion_mnist("test", normalize=False)
    for index in args.test_index:
        if index >= len(x_test):
            raise CommandError(f"--test-index: {index} is out of range; the Fashion-MNIST test split has "
                               f"{len(x_test):,} images (0-{len(x_test) - 1})")
    card = card or zoo.model_card(args.preset)
    log, meta_training = training_records(args.preset, args.weights)
    table, unreadable = None, None
    if log:
        try:  # its columns tell whether it holds the prototype assignment history
            table = read_training_log(log)
        except ValueError as error:  # an empty or foreign log.csv beside the weights: no curves, the rest is drawn
            log, unreadable = None, str(error).removeprefix("`logs`: ")
    logs = {args.preset: log} if log else None
    # a directory's own config.json builds the model its weights were trained in (a tuned head, say)
    model = zoo.load(directory) if directory else zoo.load(args.preset, weights=args.weights,
                                                           **trained_head(args.preset, args.weights))
    fitting = available_kinds(model, logs, meta_training)
    kinds = list(dict.fromkeys(args.kinds)) if args.kinds else fitting  # a kind named twice is drawn once
    no_log = (f"no training log goes with the weights explained: none of {', '.join(LOG_FILES)} in their directory, "
              "nor a card with a meta-training history" if unreadable is None else
              f"the training log beside the weights cannot be read: {unreadable}")
    for kind in kinds:
        if kind not in fitting:
            reason = no_log if kind == "curves" else why_not(kind, model)
            raise CommandError(f"--kinds: {kind!r} does not fit preset {args.preset} ({reason}); it fits: "
                               f"{', '.join(fitting)}")
    shape = model_input_shape(model)
    images, labels, names, indices = _inputs(args, shape, x_test, y_test)
    class_names = FASHION_MNIST_CLASSES if card.get("dataset") == "fashion_mnist" else None
    history = log if logs and "prototypes" in kinds and "prototype_changes" in table else None
    pool = _evaluation_classes(args.preset, card)
    written = {}
    plain = [kind for kind in kinds if kind != "emd"]
    if plain:
        gallery_indices = _gallery(y_test, args.gallery_size, pool)
        position = {int(index): i for i, index in enumerate(gallery_indices)}
        exclude = [position.get(index, -1) for index in indices]
        neighbours = len(gallery_indices) - (1 if any(index >= 0 for index in exclude) else 0)
        if "retrieval" in plain and args.top_k > neighbours:  # before anything is drawn or written
            raise CommandError(f"--top-k {args.top_k}: the gallery holds {neighbours} image(s) to rank (the query "
                               f"itself left out); give a smaller --top-k or a larger --gallery-size")
        gallery = x_test[gallery_indices] if "retrieval" in plain else None
        written.update(explain_model(model, args.out, images=np.stack(images), labels=labels, names=names,
                                     kinds=plain, class_names=class_names, gallery=gallery,
                                     gallery_labels=y_test[gallery_indices], gallery_exclude=exclude, logs=logs,
                                     history=history, k=args.top_k, dpi=args.dpi, meta_training=meta_training))
    if "emd" in kinds:
        written["emd"] = []
        for image, label, name, index in zip(images, labels, names, indices):
            classes, support, support_labels, episode_label = _episode(model, label, index, y_test, args.seed, pool)
            episode_names = [class_names[c] if class_names else str(c) for c in classes]
            support_images = prepare_images(x_test[support], shape)
            result = explain_model(model, args.out, images=image[None], labels=[episode_label], names=[name],
                                   kinds=["emd"], class_names=episode_names,
                                   support=(support_images, support_labels), dpi=args.dpi)
            written["emd"] += result["emd"]
    for kind in kinds:
        for path in written.get(kind, []):
            print(f"{kind}: {path}")
    return written


def _evaluation_classes(name, card):
    """The classes a retrieval or few-shot preset is evaluated on (its card's or registry entry's
    ``eval_classes``), or ``None``."""

    return card.get("eval_classes") or PRESETS[name].data.eval_classes
