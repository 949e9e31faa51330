"""What the recipes of every task share: the preset's spec for a run (:func:`preset_spec`: another data set, recipe
overrides), the run options, the standard callbacks, and the preset directory a run writes (:func:`write_preset`).

A run writes into ``out_dir``: ``run.json`` (what it trains, :mod:`training.recipes.run_directory`), ``backup/``
(``keras.callbacks.BackupAndRestore``, so a killed run resumes at its last finished epoch, under the same options
only), ``log.csv`` (per-epoch metrics and the layers' signals, such as an MPW head's Sinkhorn iterations:
:func:`standard_callbacks`), and at the end ``config.json`` (``zoo.preset_format.write_config``), ``model.weights.h5``
and ``metadata.json`` (the model card, whose ``recipe`` is ``dataclasses.asdict`` of the recipe that ran): a preset
directory that ``zoo.load(out_dir)`` and ``otzoo export`` read.
"""
import dataclasses
import datetime
import json
import os
import shlex
from typing import Any, NamedTuple

import keras
import numpy as np

from ot_layers.callbacks.layer_signals import LayerSignals
from ot_layers.optional import require, require_tensorflow, tensorflow_if_installed
from training.data.datasets import check_dataset_augmentation, data_spec
from training.data.errors import EmptySliceError
from training.distributed.keras_distribution import (
    KerasDistribution,
    describe_distribution,
    hardware_description,
    keras_distribution,
)
from training.distributed.strategies import is_chief, make_strategy, strategy_name, tf_config
from training.recipes.components import check_pad, check_recipe
from training.recipes.epoch_log import EpochLog
from training.recipes.tuned_config import load_tuned_config
from zoo.loading import CARD_FILE, WEIGHTS_FILE, load, model_card, sha256_of
from zoo.preset_format import preset_card, read_card, weights_directory, write_config
from zoo.registry import PRESETS
from zoo.spec import PresetSpec, published_recipe, recipe_from_dict

tf = tensorflow_if_installed("tf.distribute strategies")

PROBE_IMAGES = 64  # the training images on which LayerSignals runs the heads at the end of each epoch


def run_options(name, strategy="auto", config=None, tensorboard=None):
    """What every recipe's run shares: ``(strategy, head overrides, learning rate or None, extra callbacks)``.

    ``strategy``: a name for ``training.distributed.make_strategy`` (``"auto"``: all local GPUs, else the CPU; a
    ``TF_CONFIG`` naming several workers: ``multi_worker``). ``config``: a ``best.json`` from ``otzoo tune`` for this
    preset (its head parameters and learning rate). ``tensorboard``: a log directory for
    ``keras.callbacks.TensorBoard``.
    """

    tuned = load_tuned_config(config, name) if config is not None else None
    if tensorboard:  # tf.summary needs TensorFlow, on every backend, and the tensorboard package (the tune extra):
        require_tensorflow("--tensorboard (Keras writes TensorBoard logs with tf.summary)",  # checked first, and
                           "train without --tensorboard (log.csv in the run's directory holds every epoch's metrics "
                           "and the layers' signals)")  # before anything is written
        require("tensorboard", "tune", "--tensorboard")
    callbacks = [keras.callbacks.TensorBoard(tensorboard)] if tensorboard else []
    return (run_strategy(strategy), dict(tuned["head_kwargs"]) if tuned else {},
            tuned["learning_rate"] if tuned else None, callbacks)


def run_strategy(name="auto"):
    """The device layout a run builds and trains under: ``training.distributed.strategies.make_strategy(name)`` on
    the TensorFlow backend, ``training.distributed.keras_distribution.keras_distribution(name)`` on JAX and
    PyTorch (a strategy object of either kind is returned as is)."""
    if keras.backend.backend() == "tensorflow":
        return make_strategy(name)
    return keras_distribution(name)


def current_strategy(strategy=None):
    """``strategy``, else the one a model is built under when none is named: TensorFlow's current strategy, or one
    device on JAX and PyTorch."""
    if strategy is not None:
        return strategy
    return tf.distribute.get_strategy() if keras.backend.backend() == "tensorflow" else keras_distribution("auto")


def describe_strategy(strategy):
    """The card's ``strategy`` line."""
    if isinstance(strategy, KerasDistribution):
        return describe_distribution(strategy)
    return f"{type(strategy).__name__} ({strategy_name(strategy)}, {strategy.num_replicas_in_sync} replica(s))"


def preset_spec(name, dataset=None, image_size=None, **recipe_overrides):
    """The :class:`zoo.spec.PresetSpec` a run of preset ``name`` (a name or a spec) follows: on ``dataset`` (default
    the preset's; another one gets its input shape, classes, pixel statistics and class split from
    ``training.data.datasets.data_spec``) at ``image_size`` (TFDS data sets), with the non-``None``
    ``recipe_overrides`` applied (NumPy scalars among them made Python numbers). Unknown names in the recipe, values
    out of range and fields the recipe would ignore (``momentum`` with ``adam``, ``pad`` with ``augment="none"``)
    raise ``ValueError`` naming the field."""
    spec = name if isinstance(name, PresetSpec) else _registered(name)
    if (dataset is not None and dataset != spec.data.dataset) or image_size is not None:
        spec = spec.with_data(data_spec(dataset or spec.data.dataset, spec.task, image_size))
    spec = spec.with_recipe(**recipe_overrides)
    spec = dataclasses.replace(spec, recipe=check_recipe(spec.recipe, spec.task))  # NumPy scalars made Python's
    ways, train_classes = getattr(spec.recipe, "ways", None), spec.data.train_classes
    if ways is not None and train_classes is not None and ways > len(train_classes):
        raise ValueError(f"recipe field `ways` must be at most the {len(train_classes)} base classes of "
                         f"{spec.data.dataset}'s few-shot split, got {ways}.")
    model_ways = getattr(spec.architecture, "ways", None)
    if ways is not None and model_ways is not None and ways != model_ways:  # episodes the model has no room for
        raise ValueError(f"recipe field `ways` ({ways}) must be the {model_ways} ways of the preset's model, which "
                         "meta-trains and is evaluated on episodes of that many classes.")
    check_dataset_augmentation(spec.data.dataset, spec.recipe.augment, spec.task)
    check_pad(spec.recipe)
    return spec


def _registered(name):
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}.")
    return PRESETS[name]


def preset_recipe(name, **overrides):
    """The recipe of preset ``name`` with the non-``None`` ``overrides`` applied (a frozen ``zoo.spec.Recipe`` or
    ``FewShotRecipe``)."""
    return preset_spec(name, **overrides).recipe


def evaluation_spec(preset, weights=None):
    """``(spec, card)`` of what ``otzoo evaluate`` evaluates, without loading the model: for a built-in preset's
    name, its spec and packaged card, or with ``weights`` the card that comes with them (that of their preset
    directory, ``zoo.preset_format.weights_directory``), whose recipe the spec then takes, so that its evaluation
    settings (a few-shot card's ``eval_episodes``, ``eval_queries``) and the ``limit`` they need are those ``otzoo
    evaluate`` of the directory uses; ``{}`` and the preset's recipe when they have none, as a lone weights file or
    a URL (the packaged card describes other weights). For a preset directory, the spec of its card
    (:func:`card_spec`: the preset's architecture re-targeted at the card's data set and input shape, the card's
    recipe)."""
    if preset in PRESETS:
        spec = PRESETS[preset]
        if weights is None:
            return spec, model_card(preset)
        folder = weights_directory(weights)
        card = (read_card(folder) if folder is not None else None) or {}  # None: no card there
        if card.get("recipe") and card.get("task") == spec.task:  # evaluated as `otzoo evaluate RUN` evaluates it
            spec = dataclasses.replace(spec, recipe=recipe_from_dict(spec.task, card["recipe"]))
        return spec, card
    if not os.path.isdir(str(preset)):
        raise ValueError(f"Unknown preset {preset!r}: give a preset name ({', '.join(sorted(PRESETS))}) or a preset "
                         "directory.")
    if weights is not None:
        raise ValueError("`weights` applies to preset names; a preset directory holds its own weights.")
    card = preset_card(preset)  # a directory without a card: an error naming it
    return card_spec(card), card


def evaluation_target(preset, weights=None):
    """``(model, spec, card)`` of what ``otzoo evaluate`` evaluates (:func:`evaluation_spec`): a built-in preset
    with its packaged weights or ``weights``, or a preset directory (``zoo.load(directory)``)."""
    spec, card = evaluation_spec(preset, weights)
    return (load(preset) if weights is None else load(preset, weights=weights)), spec, card


def card_spec(card):
    """The :class:`zoo.spec.PresetSpec` a model card describes (its task, data set, input shape and recipe; the
    architecture of the preset it names, its ``fine_tuned.base`` for a fine-tuned run, or else of the first preset
    of its task)."""
    task = card.get("task")
    tuned = card.get("fine_tuned")
    name = tuned.get("base") if isinstance(tuned, dict) else card.get("name")
    base = (PRESETS.get(name) if isinstance(name, str) else None) \
        or next((s for s in PRESETS.values() if s.task == task), None)
    if base is None:
        raise ValueError(f"the card's task must be one of the presets' tasks, got {task!r}.")
    dataset, shape = card.get("dataset"), card.get("input_shape")
    if not dataset or not isinstance(dataset, str):
        raise ValueError("the card states no `dataset` (the name of the data set the model was trained on and is "
                         f"evaluated on), got {dataset!r}.")
    if shape is not None and (not isinstance(shape, (list, tuple)) or len(shape) != 3
                              or not all(isinstance(side, int) and not isinstance(side, bool) for side in shape)):
        raise ValueError(f"the card's `input_shape` must be [height, width, channels], got {shape!r}.")
    spec = base
    if dataset != base.data.dataset or (shape and tuple(shape) != tuple(base.data.input_shape)):
        spec = base.with_data(data_spec(dataset, base.task, shape[0] if shape else None))
    return dataclasses.replace(spec, recipe=recipe_from_dict(base.task, card.get("recipe") or {}))


def card_base_preset(card):
    """The built-in preset a preset directory's ``card`` comes from (its ``fine_tuned.base``, else its ``name``),
    whose recipe evaluates and fine-tunes the directory. Unlike :func:`card_spec`, which falls back on the first
    preset of the card's task, a ``ValueError`` when the card names none or states another task than that preset's."""
    fine_tuned = card.get("fine_tuned")
    if fine_tuned is not None and not isinstance(fine_tuned, dict):
        raise ValueError(f"`fine_tuned` must be an object describing the fine-tuning run (its `base`: the preset "
                         f"fine-tuned), got {fine_tuned!r}.")
    name = (fine_tuned or {}).get("base") or card.get("name")
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"it names no built-in preset (name {name!r}); only copies, training runs and fine-tuned runs "
                         "of a preset are read by its recipe.")
    if card.get("task") != PRESETS[name].task:
        raise ValueError(f"it states task {card.get('task')!r}, preset {name} is {PRESETS[name].task}.")
    return name


class FineTuneSetup(NamedTuple):
    """What ``otzoo fine-tune`` fits (each task's ``fine_tune_setup``): ``trained``, the model ``model.fit`` trains
    (the served model, or it with what the recipe's loss needs: class proxies, the labels as a second input), by
    ``loss``, on ``data``, the batches as the recipe trains on them (shuffled and augmented anew each epoch);
    ``evaluation``, the same images in a fixed order without augmentation (few-shot: the same episodes), on which the
    loss before and after fitting is measured, so both are on the same inputs; ``fitted``, what an epoch fits in
    words."""
    trained: Any
    loss: Any
    data: Any
    evaluation: Any
    fitted: str


def check_fine_tune_batch(images, batch_size, limit, what):
    """Raise :class:`EmptySliceError` naming ``limit`` when ``images`` (the first ``limit`` training images, of
    ``what``) cannot fill one fine-tuning batch of ``batch_size`` (``otzoo fine-tune`` drops an incomplete one)."""
    if len(images) < batch_size:
        raise EmptySliceError(f"{len(images)} {what}, fewer than one batch of {batch_size} (fine-tuning drops an "
                              "incomplete batch); give more images", parameter="limit", value=limit)


def fine_tune_images(images, batch_size, what, among=None):
    """What one epoch of fine-tuning fits, in words: the ``images`` (a count, of ``what``: "training images", or
    those of the seen classes ``among`` the first N) in full batches of ``batch_size``, the images left over from
    the last full batch (an incomplete batch, dropped) stated, e.g. "256 of the first 300 training images (the last
    44, an incomplete batch of 128, dropped)"."""
    fitted = images // batch_size * batch_size
    source = f"the first {images:,} {what}" if among is None else f"the {images:,} {what} among the first {among:,}"
    if fitted == images:
        return source
    return (f"{fitted:,} of {source} (the last {images - fitted:,}, an incomplete batch of {batch_size}, "
            "dropped)")


def evaluation_slice(limit, labels):
    """``(images per evaluation class, a description)`` of ``labels``: the evaluation classes' labels among the
    first ``limit`` test images, for the error of an ``otzoo evaluate --limit`` too small for a metric."""
    classes, counts = np.unique(labels, return_counts=True)
    per_class = dict(zip(classes.tolist(), counts.tolist()))
    return counts, (f"the first {limit:,} test images hold {len(labels):,} of the evaluation classes (per class: "
                    f"{per_class})")


def standard_callbacks(out_dir, probe_images=None):
    """What every run's ``fit`` gets before the run's own loggers: with ``probe_images`` (the run's training
    images) the layers' signals on the first :data:`PROBE_IMAGES` of them (``ot_layers.callbacks.layer_signals.
    LayerSignals``, first, so that every logger after it writes them); epoch checkpoints that a killed run resumes
    from; and the per-epoch log (:class:`~training.recipes.epoch_log.EpochLog`: a resumed run appends to it, also
    when it logs other columns)."""
    signals = [LayerSignals(probe_images[:PROBE_IMAGES])] if probe_images is not None else []
    return signals + [keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")),
                      EpochLog(os.path.join(out_dir, "log.csv"))]


def reproducing_command(name, recipe_overrides=None, subcommand="train", **options):
    """``otzoo train NAME`` (or another ``subcommand``; ``name``: a preset's, or a preset directory) with the options
    that were given (``None`` ones left out, in the order given) and ``--recipe FIELD=VALUE`` for each of
    ``recipe_overrides``; ``--backend`` when the active one is not TensorFlow. The name and values are quoted for a
    POSIX shell where they need it (a path with a space)."""
    recipe = [f"--recipe {shlex.quote(f'{field}={json.dumps(list(value) if isinstance(value, tuple) else value)}')}"
              for field, value in (recipe_overrides or {}).items()]
    backend = keras.backend.backend()
    program = f"otzoo {subcommand}" if backend == "tensorflow" else f"otzoo --backend {backend} {subcommand}"
    return " ".join([f"{program} {shlex.quote(str(name))}"]
                    + [f"--{flag.replace('_', '-')} {shlex.quote(str(value))}" for flag, value in options.items()
                       if value is not None] + recipe)


def merged_overrides(recipe_overrides, **options):
    """The recipe overrides of a run: ``recipe_overrides`` (``otzoo train --recipe``) and the non-``None`` named
    ones (``--epochs``, ``--seed``, ...), which win."""
    if recipe_overrides is not None and not isinstance(recipe_overrides, dict):
        raise ValueError(f"`recipe_overrides` must be a dict of recipe fields, got {recipe_overrides!r}.")
    merged = dict(recipe_overrides or {})
    merged.update({key: value for key, value in options.items() if value is not None})
    return merged


def write_preset(model, spec, out_dir, recipe, metrics, train_time, strategy, command, head_overrides=None,
                 limit=None, **extra):
    """Save ``model``'s weights and the model card into ``out_dir``; returns the card. ``head_overrides``: the head's
    (or pooling's) parameters a tuned configuration replaced, recorded in the card as ``head_overrides`` and named
    in its description (whose preset text describes the preset's own head). ``limit``: the run trained on the first
    ``limit`` training images (``--limit``), which the card's ``split`` states. Of several workers only the
    chief writes into ``out_dir``: the others (which must save too) write into ``worker-<i>`` of a scratch folder
    outside it, ``$OTZOO_WORKER_SCRATCH`` (``otzoo train --workers`` gives one and removes it) or else a temporary
    folder removed when the process ends."""

    if not isinstance(spec, PresetSpec):
        spec = _registered(spec)
    if not is_chief():
        import atexit, shutil, tempfile  # noqa: E401, PLC0415 - standard library, the non-chief branch only

        scratch = os.environ.get("OTZOO_WORKER_SCRATCH")  # training.distributed.launch.SCRATCH_ENV
        if not scratch:
            scratch = tempfile.mkdtemp(prefix="otzoo-worker-")
            atexit.register(shutil.rmtree, scratch, True)
        out_dir = os.path.join(scratch, f"worker-{(tf_config() or {}).get('task', {}).get('index', 0)}")
        os.makedirs(out_dir, exist_ok=True)
    write_config(model, out_dir)
    weights = os.path.join(out_dir, WEIGHTS_FILE)
    model.save_weights(weights)
    among = "" if spec.task == "classification" else " (those of the training classes among them)"
    split = spec.data.split if limit is None else \
        f"{spec.data.split}; trained on the first {limit:,} images of the training split{among} (--limit {limit})"
    default = PRESETS.get(spec.name)
    # the preset's own description only for its own data in full: with --limit it would claim the whole split
    description = spec.description if default is not None and default.data == spec.data and limit is None else \
        f"The {spec.name} architecture and recipe, trained on {spec.data.dataset} ({split})."
    if head_overrides:
        description = (f"The {spec.name} architecture and recipe with the tuned head parameters "
                       f"{json.dumps(head_overrides, sort_keys=True)}, trained on {spec.data.dataset} ({split}).")
    card = dict(name=spec.name, task=spec.task, dataset=spec.data.dataset, split=split,
                description=description, recipe=published_recipe(recipe), metrics=metrics,
                parameters=int(model.count_params()), weights_sha256=sha256_of(weights),
                train_time_s=round(train_time, 1), hardware=hardware_description(), backend=keras.backend.backend(),
                strategy=describe_strategy(strategy),
                command=command, date=datetime.date.today().isoformat(),
                note="train_time_s counts this process only (a resumed run restarts the clock)")
    card["input_shape"] = list(spec.data.input_shape)
    if head_overrides:
        card["head_overrides"] = dict(head_overrides)
    for key in ("train_classes", "eval_classes"):
        if getattr(spec.data, key) is not None:
            card[key] = list(getattr(spec.data, key))
    card.update(extra)
    with open(os.path.join(out_dir, CARD_FILE), "w") as handle:
        json.dump(card, handle, indent=2)
    return card


