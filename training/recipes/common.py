"""The recipes that train the zoo's presets (``otzoo train PRESET``) and recompute their cards (``otzoo evaluate``).

:func:`train_preset` and :func:`evaluate_preset` dispatch on the preset's task: classification here, retrieval in
:mod:`training.retrieval_recipe`, few-shot in :mod:`training.few_shot_recipe`. A run writes into ``out_dir``:
``backup/`` (``keras.callbacks.BackupAndRestore``, so a killed run resumes at its last finished epoch), ``log.csv``
(per-epoch metrics), and at the end ``model.weights.h5`` and ``metadata.json`` (the model card).
"""
import datetime
import json
import os
import platform

import keras
import tensorflow as tf

from training.distributed.strategies import is_chief, make_strategy, strategy_name, tf_config
from training.recipes.tuned_config import load_tuned_config
from zoo.loading import CARD_FILE, WEIGHTS_FILE, sha256_of
from zoo.registry import PRESETS


def hardware_description():
    return f"{platform.machine()} CPU x{os.cpu_count()}" + "".join(
        f", {d.name}" for d in tf.config.list_physical_devices("GPU"))


def run_options(name, strategy="auto", config=None, tensorboard=None):
    """What every recipe's run shares: ``(strategy, head overrides, learning rate or None, extra callbacks)``.

    ``strategy``: a name for ``training.strategies.make_strategy`` (``"auto"``: all local GPUs, else the CPU; a
    ``TF_CONFIG`` naming several workers: ``multi_worker``). ``config``: a ``best.json`` from ``otzoo tune`` for this
    preset (its head parameters and learning rate). ``tensorboard``: a log directory for
    ``keras.callbacks.TensorBoard``.
    """

    tuned = load_tuned_config(config, name) if config is not None else None
    callbacks = [keras.callbacks.TensorBoard(tensorboard)] if tensorboard else []
    return (make_strategy(strategy), dict(tuned["head_kwargs"]) if tuned else {},
            tuned["learning_rate"] if tuned else None, callbacks)


def sgd_cosine(recipe, steps):
    """SGD (momentum, Nesterov as the recipe says) with a cosine decay of the recipe's learning rate to 0 over
    ``steps``."""
    schedule = keras.optimizers.schedules.CosineDecay(recipe["learning_rate"], decay_steps=steps)
    return keras.optimizers.SGD(schedule, momentum=recipe["momentum"], nesterov=recipe["nesterov"])


def preset_recipe(name, **overrides):
    """The recipe of preset ``name`` with the non-``None`` ``overrides`` applied."""
    recipe = dict(PRESETS[name]["recipe"])
    recipe.update({key: value for key, value in overrides.items() if value is not None})
    return recipe


def standard_callbacks(out_dir):
    """Epoch checkpoints that a killed run resumes from, and the per-epoch log."""
    return [keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")),
            keras.callbacks.CSVLogger(os.path.join(out_dir, "log.csv"), append=True)]


def reproducing_command(name, **options):
    """``otzoo train NAME`` with the options that were given (``None`` ones left out)."""
    return " ".join([f"otzoo train {name}"] + [f"--{flag.replace('_', '-')} {value}"
                                               for flag, value in options.items() if value is not None])


def write_preset(model, name, out_dir, recipe, metrics, train_time, strategy, command, **extra):
    """Save ``model``'s weights and the model card into ``out_dir`` (only the chief of several workers writes; the
    others write into ``out_dir/worker-<i>``); returns the card."""

    spec = PRESETS[name]
    if not is_chief():
        out_dir = os.path.join(out_dir, f"worker-{(tf_config() or {}).get('task', {}).get('index', 0)}")
        os.makedirs(out_dir, exist_ok=True)
    weights = os.path.join(out_dir, WEIGHTS_FILE)
    model.save_weights(weights)
    card = dict(name=name, task=spec["task"], dataset=spec["dataset"], split=spec["split"],
                description=spec["description"], recipe=recipe, metrics=metrics,
                parameters=int(model.count_params()), weights_sha256=sha256_of(weights),
                train_time_s=round(train_time, 1), hardware=hardware_description(),
                strategy=f"{type(strategy).__name__} ({strategy_name(strategy)}, "
                         f"{strategy.num_replicas_in_sync} replica(s))",
                command=command, date=datetime.date.today().isoformat(),
                note="train_time_s counts this process only (a resumed run restarts the clock)")
    for key in ("train_classes", "eval_classes"):
        if key in spec:
            card[key] = list(spec[key])
    card.update(extra)
    with open(os.path.join(out_dir, CARD_FILE), "w") as handle:
        json.dump(card, handle, indent=2)
    return card


