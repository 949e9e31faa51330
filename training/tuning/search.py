"""Hyper-parameter search for a preset's head with keras-tuner (``otzoo tune PRESET``).

:func:`tune` searches the head's own parameters (:func:`search_space`) and the learning rate by random search:
each trial builds the preset's architecture with the sampled head arguments, trains it for ``epochs`` epochs on
the training split minus a validation part carved from it (the test split is never read), and is scored on that
validation part. What is carved, trained and scored is the task's, from its recipe module
(``training.recipes.recipe_for(task)``: ``TUNING_OBJECTIVE``, ``tuning_data``, ``tuning_parts``,
``tuning_score``):

- classification presets: a class-stratified share of the training images (:func:`validation_split`), scored by
  accuracy (``val_accuracy``);
- retrieval presets: whole seen classes held out (:func:`held_out_classes_split`, the retrieval protocol one level
  down: the trial trains on the other seen classes and is scored by cosine-retrieval MAP@R among the held-out
  classes' training images, ``val_map_at_r``).

A trial trains by the recipe ``otzoo train`` follows, weight decay included
(:func:`training.tuning.trial.trial_setup`), on one device of any Keras backend (a JAX search does not spread its
trials over several devices with ``keras.distribution``). :func:`tune` prints a summary of the trials and writes the
best configuration as JSON (:data:`CONFIG_FORMAT`), which ``training.recipes.tuned_config.load_tuned_config`` reads
back for ``otzoo train --config``.

Search spaces by head (the vocabulary of ``docs/api.md``):

- ``mpw`` (MultiProxyWasserstein): ``epsilon`` (log-uniform 0.02-0.5), ``num_proxies`` (1, 2, 4, 8);
- ``hyperspherical`` (DL2PA): ``dim`` (``num_classes - 1`` -- the simplex, the default --, 16, 32, 64);
- ``gsp`` pooling (retrieval): ``epsilon`` (log-uniform 0.05-2.0; the thesis' ``1 / gamma``), ``transport_ratio``
  (0.1-0.9), ``num_prototypes`` (16, 32, 64, 128);
- ``gap`` pooling (retrieval): the learning rate only;
- ``emd`` (few-shot): ``scale`` (log-uniform 2-50; EMDHead's logit multiplier, the "temperature" of DeepEMD);
- ``gap_fc``: the learning rate only;

always with ``learning_rate`` (log-uniform, a decade either side of the recipe's, capped to 1e-4 .. 1).

Trials run for the presets whose task has a ``TUNING_OBJECTIVE`` (classification and retrieval) on Fashion-MNIST;
the few-shot head's space is defined here but its trials need the episodic recipe: a few-shot preset raises a
``ValueError`` saying so.
"""
import json
import math
import os
import shutil
import zlib

import keras

from ot_layers.callbacks.layer_signals import LayerSignals
from ot_layers.optional import require
from ot_layers.validation import check_flag, check_output_path, check_positive_int, check_seed
from training.data.errors import EmptySliceError
from training.recipes import RECIPES, recipe_for
from training.recipes.common import PROBE_IMAGES
from training.recipes.run_directory import claim_run_directory, held_state, run_identity
from training.recipes.tuned_config import CONFIG_FORMAT
from training.recipes.validation import VALIDATION_IMAGES_PER_CLASS, held_out_classes_split, validation_split
from training.tuning.trial import trial_score, trial_setup, trial_weight_decay
from zoo.backbones import BACKBONES
from zoo.preset_format import CARD_FILE, WEIGHTS_FILE
from zoo.registry import PRESETS

# The JSON written by ``tune`` (``OUT/best.json``):
#   {"format": "otzoo-tuning/1", "preset": NAME, "task": TASK,
#    "head_kwargs": {...},           # keyword arguments of the head layer (zoo.build(NAME, **head_kwargs))
#    "learning_rate": FLOAT,         # the recipe's initial learning rate to use instead
#    "objective": "val_accuracy" | "val_map_at_r", "score": FLOAT, "search": {...how it was searched...},
#    "trials": [{"trial_id", "score", "head_kwargs", "learning_rate", "signals"}, ...best first]}
# A trial's "signals" are its other logs at the epoch its score comes from (keras-tuner keeps a trial's best epoch):
# the layers' own (ot_layers.callbacks.layer_signals.LayerSignals, e.g. "mpw_head_sinkhorn_iterations") and its
# layer-state callbacks' (e.g. "prototype_changes"); a trial whose Sinkhorn head ran to ``max_iter`` shows it there.
# Only "preset", "head_kwargs" and "learning_rate" are read back (load_tuned_config); the rest documents the search.
TUNING_DATASET = "fashion_mnist"  # the only data set the trials read (the recipes' tuning_data)
# A trained model's files (a finished ``otzoo train`` run's, a saved preset's): an out_dir holding them is refused, a
# search there replaced the run's run.json and mixed its tuner/ and best.json with the model's files.
MODEL_FILES = (CARD_FILE, WEIGHTS_FILE)
__all__ = ["tune", "search_space", "tuning_objective", "tunable_tasks", "format_summary", "validation_split",
           "held_out_classes_split", "VALIDATION_IMAGES_PER_CLASS", "CONFIG_FORMAT", "MODEL_FILES"]


def tuning_objective(task):
    """The validation metric the trials of a ``task`` preset maximize (its recipe's ``TUNING_OBJECTIVE``), or
    ``None``: the task is not tunable."""
    return recipe_for(task).TUNING_OBJECTIVE


def tunable_tasks():
    """The tasks whose presets :func:`tune` runs trials for, in ``training.recipes.RECIPES``' order."""
    return [task for task, recipe in RECIPES.items() if recipe.TUNING_OBJECTIVE is not None]


def search_space(spec):
    """The parameters searched for a preset ``spec`` (a ``zoo.spec.PresetSpec``, an entry of
    ``zoo.registry.PRESETS``): a list of dicts ``{"name", "target": "head" | "optimizer", "kind": "log" | "linear" |
    "choice", "low", "high" | "values"}``."""
    head = spec.architecture.head or spec.architecture.pooling
    recipe_rate = float(spec.recipe.learning_rate)
    params = []
    if head == "mpw":
        params += [dict(name="epsilon", target="head", kind="log", low=0.02, high=0.5),
                   dict(name="num_proxies", target="head", kind="choice", values=[1, 2, 4, 8])]
    elif head == "hyperspherical":
        simplex = max(2, int(spec.data.num_classes) - 1)
        params += [dict(name="dim", target="head", kind="choice", values=sorted({simplex, 16, 32, 64}))]
    elif head == "gsp":
        params += [dict(name="epsilon", target="head", kind="log", low=0.05, high=2.0),
                   dict(name="transport_ratio", target="head", kind="linear", low=0.1, high=0.9),
                   dict(name="num_prototypes", target="head", kind="choice", values=[16, 32, 64, 128])]
    elif head == "emd":
        params += [dict(name="scale", target="head", kind="log", low=2.0, high=50.0)]
    params.append(dict(name="learning_rate", target="optimizer", kind="log", low=max(1e-4, recipe_rate / 10),
                       high=min(1.0, recipe_rate * 10)))
    return params


def _sample(hp, param):
    if param["kind"] == "choice":
        return hp.Choice(param["name"], param["values"])
    return hp.Float(param["name"], param["low"], param["high"], sampling=param["kind"])


class _ValidationScore(keras.callbacks.Callback):
    """Adds the task's objective (``objective``, e.g. ``val_accuracy`` or ``val_map_at_r``) of a trial's ``served``
    model on the ``validation`` images to each epoch's logs (``training.tuning.trial.trial_score``), before the
    tuner's callbacks read it."""

    def __init__(self, objective, spec, served, validation):
        super().__init__()
        self.objective, self.spec, self.served, self.validation = objective, spec, served, validation

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs[self.objective] = trial_score(self.spec, self.served, self.validation)


def trial_seed(seed, values):
    """The seed of the initialization of a trial with hyperparameter ``values`` in a search of ``seed``: a function
    of both only, so that a trial starts alike whatever ran before it in the process (a resumed search scored a
    trial otherwise than a fresh one: 0.1406 against 0.1797 for the same values)."""
    return (seed * 1_000_003 + zlib.crc32(json.dumps(values, sort_keys=True).encode())) % 2 ** 32


def _preset_hypermodel(spec, params, data, backbone, seed):
    """keras-tuner's hypermodel of a search on preset ``spec`` (its recipe set to the search's ``epochs`` and
    ``batch_size``): each trial is a ``training.tuning.trial`` run with the sampled head arguments and learning
    rate, initialized from :func:`trial_seed`, trained on ``data[0]`` and scored on ``data[1]``."""
    kt = require("keras_tuner", "tune", "otzoo tune")
    train, validation = data
    objective = tuning_objective(spec.task)

    class PresetHyperModel(kt.HyperModel):
        def build(self, hp):
            values = {p["name"]: _sample(hp, p) for p in params}
            keras.utils.set_random_seed(trial_seed(seed, values))
            head_kwargs = {p["name"]: values[p["name"]] for p in params if p["target"] == "head"}
            trial_spec = spec.with_recipe(learning_rate=values["learning_rate"])
            self.trial = trial_setup(trial_spec, train, head_kwargs, backbone)
            self.scorer = _ValidationScore(objective, trial_spec, self.trial.served, validation)
            return self.trial.trained

        def fit(self, hp, model, *args, callbacks=None, **kwargs):
            # The layers' signals (e.g. an MPW head's Sinkhorn iterations) join the epoch logs keras-tuner records
            signals = LayerSignals(train[0][:PROBE_IMAGES])
            callbacks = self.trial.callbacks + [signals, self.scorer] + list(callbacks or [])
            return model.fit(self.trial.batches, epochs=spec.recipe.epochs, callbacks=callbacks,
                             verbose=kwargs.get("verbose", 0), shuffle=False)  # the batches' own seeded order

    return PresetHyperModel()


def _trial_config(trial, params, objective):
    values = trial.hyperparameters.values
    recorded = trial.metrics.metrics  # {name: history} at the trial's best epoch; none for a failed trial
    last = {name: trial.metrics.get_last_value(name) for name in sorted(recorded) if name not in ("loss", objective)}
    signals = {name: float(value) for name, value in last.items() if value is not None}
    return dict(trial_id=trial.trial_id, score=None if trial.score is None else float(trial.score),
                head_kwargs={p["name"]: values[p["name"]] for p in params if p["target"] == "head"},
                learning_rate=float(values["learning_rate"]), signals=signals)


def _listed(values):
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()) or "-"


def format_summary(preset, trials, objective="val_accuracy"):
    """The trial table :func:`tune` prints: rank, trial, validation score, learning rate, head arguments, and the
    trial's signals (its layers' at the scored epoch, e.g. Sinkhorn iterations) where any trial has some."""
    with_signals = any(t.get("signals") for t in trials)
    lines = [f"otzoo tune {preset}: {len(trials)} trial(s), best first (score: {objective})",
             f"{'rank':>4}  {'trial':>5}  {'score':>7}  {'learning_rate':>13}  head_kwargs"
             + ("  |  signals" if with_signals else "")]
    for rank, t in enumerate(trials, 1):
        score = "failed" if t["score"] is None else f"{t['score']:.4f}"
        line = f"{rank:>4}  {t['trial_id']:>5}  {score:>7}  {t['learning_rate']:>13.4g}  {_listed(t['head_kwargs'])}"
        lines.append(line + (f"  |  {_listed(t.get('signals', {}))}" if with_signals else ""))
    return "\n".join(lines)


def _remove_search(out_dir):
    """Remove what a search wrote in ``out_dir`` besides its ``run.json``: ``tuner/`` (the trials of every preset
    searched there) and ``best.json``; nothing else."""
    for name in ("tuner", "best.json"):
        path = os.path.join(out_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


def tune(preset, trials, out_dir, epochs=1, limit=None, batch_size=None, backbone=None, validation_fraction=0.2,
         seed=0, resume=False, overwrite=False, verbose=1):
    """Random search over the head's parameters and the learning rate of ``preset``; returns the best
    configuration (also written to ``out_dir/best.json``, format :data:`CONFIG_FORMAT`).

    ``trials``: how many configurations are trained; ``epochs`` per trial; ``limit``: use the first ``limit``
    training images (the validation part is carved from them); ``batch_size``: default the recipe's;
    ``backbone``: a ``zoo.BACKBONES`` name replacing the preset's (e.g. ``"small_convnet"`` for quick searches);
    ``validation_fraction``: the share of the training images (classification) or of the seen classes (retrieval,
    at least two classes) held out to score trials; ``resume``: continue a search in ``out_dir`` instead of
    starting over (the same search only, ``trials`` apart: ``out_dir/run.json`` records it, and other settings
    raise ``training.recipes.run_directory.ResumeMismatchError``); ``overwrite``: start a new search in an
    ``out_dir`` that holds one (``tuner/`` or ``best.json``), replacing it (when the new search begins, the
    earlier one's ``tuner/``, whatever preset it searched, and ``best.json`` are removed and ``run.json`` records the
    new search; nothing else is touched); without either such an ``out_dir`` is refused, so a search of many trials
    is not thrown away by a call made twice (an ``out_dir`` holding a trained model, :data:`MODEL_FILES`, is refused
    either way), and so is ``resume`` in an ``out_dir`` holding a ``best.json`` but no ``tuner/`` (nothing to
    resume, and the new search would replace that ``best.json``);
    ``verbose``: 1 prints keras-tuner's per-trial progress and the summary, 0 nothing.
    Each trial is initialized from :func:`trial_seed` of ``seed`` and its values, so a trial scores the same in a
    resumed search as in a fresh one. A GSP retrieval trial pools like GAP during its first epoch (the warm-up of
    ``GSPPrototypeInit``): give it ``epochs >= 2``.
    """
    kt = require("keras_tuner", "tune", "otzoo tune")
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"`preset` {preset!r} is unknown; known presets: {', '.join(sorted(PRESETS))}.")
    if backbone is not None and (not isinstance(backbone, str) or backbone not in BACKBONES):
        # checked here, not by the first trial's build, which ran once the out_dir was claimed (run.json written)
        raise ValueError(f"`backbone` {backbone!r} is unknown; known backbones: {', '.join(BACKBONES)}.")
    trials = check_positive_int("trials", trials)
    epochs = check_positive_int("epochs", epochs)
    if limit is not None:
        limit = check_positive_int("limit", limit)
    seed = check_seed("seed", seed)
    check_output_path("out_dir", out_dir, directory=True)
    resume, overwrite = check_flag("resume", resume), check_flag("overwrite", overwrite)
    model_files = held_state(out_dir, MODEL_FILES)
    if model_files:
        raise ValueError(f"`out_dir` {out_dir!r} holds a trained model ({', '.join(model_files)}), not a search: a "
                         "search there would replace its run.json; tune into another directory.")
    if resume and overwrite:
        raise ValueError("`overwrite`: pass resume=True to continue a search or overwrite=True to replace it, not "
                         "both.")
    earlier = held_state(out_dir, ["tuner", "best.json"])
    if earlier and not (resume or overwrite):  # keras-tuner's own default (overwrite=False) resumes
        raise ValueError(f"`out_dir` {out_dir!r} holds an earlier search ({', '.join(earlier)}); pass resume=True "
                         "to continue it, or overwrite=True to start a new search in its place.")
    if resume and earlier == ["best.json"]:  # a new search would replace best.json: the earlier result lost
        raise ValueError(f"`resume`: `out_dir` {out_dir!r} holds the best.json of an earlier search but not its "
                         "trials (tuner/), so there is nothing to resume; pass overwrite=True to replace it, or tune "
                         "into another directory.")
    spec = PRESETS[preset]
    # None takes the recipe's batch size; 0 is refused (``batch_size or ...`` trained with 128 without a word)
    batch_size = check_positive_int("batch_size", spec.recipe.batch_size if batch_size is None else batch_size)
    objective = tuning_objective(spec.task)
    if objective is None:
        raise ValueError(f"`preset` {preset!r} is a {spec.task} preset: its search space is defined "
                         f"({[p['name'] for p in search_space(spec)]}) but its trials need the {spec.task} "
                         "training recipe, not wired into tuning yet.")
    if spec.data.dataset != TUNING_DATASET:
        raise ValueError(f"`preset` {preset!r}: tuning reads Fashion-MNIST only, not {spec.data.dataset!r}.")
    params = search_space(spec)
    # A resumed search must be the same search: its trials are ranked together and best.json states its settings.
    # ``trials`` may differ (a search continued for more trials).
    # ``weight_decay``: a search begun by an otzoo whose trials left the recipe's weight decay out is not resumed.
    search = run_identity(spec, epochs=epochs, limit=limit, batch_size=batch_size, backbone=backbone,
                          validation_fraction=validation_fraction, seed=seed, space=params,
                          weight_decay=trial_weight_decay(spec, backbone))
    keras.utils.set_random_seed(seed)
    train, val, split = recipe_for(spec.task).tuning_data(limit, validation_fraction, seed)  # never the test split
    if len(train[0]) < batch_size:
        raise EmptySliceError(f"{len(train[0])} training examples left after the validation split, fewer than one "
                              f"batch of {batch_size}; lower `batch_size` or raise `limit`",
                              *(("limit", limit) if limit is not None else ("batch_size", batch_size)))
    claim_run_directory(out_dir, search, state=("tuner",) if resume else (), restarts=() if resume else ("tuner",))
    if overwrite:  # the replaced search's own files (run.json now records this one): all its trials, of whatever
        _remove_search(out_dir)  # preset (keras-tuner's overwrite clears tuner/PRESET only), and its best.json
    trial_spec = spec.with_recipe(epochs=epochs, batch_size=batch_size)
    hypermodel = _preset_hypermodel(trial_spec, params, (train, val), backbone, seed)
    tuner = kt.RandomSearch(hypermodel, objective=kt.Objective(objective, direction="max"), max_trials=trials,
                            seed=seed, directory=os.path.join(out_dir, "tuner"), project_name=preset,
                            overwrite=not resume)
    tuner.search(verbose=verbose)
    done = [t for t in tuner.oracle.trials.values() if t.status == "COMPLETED"]
    if not done:
        raise ValueError(f"`preset` {preset!r}: every trial failed; see keras-tuner's messages above.")
    ranked = sorted((_trial_config(t, params, objective) for t in tuner.oracle.trials.values()),
                    key=lambda t: -math.inf if t["score"] is None else t["score"], reverse=True)
    best = ranked[0]
    config = dict(format=CONFIG_FORMAT, preset=preset, task=spec.task, head_kwargs=best["head_kwargs"],
                  learning_rate=best["learning_rate"], objective=objective, score=best["score"],
                  search=dict(trials=len(ranked), epochs=epochs, limit=limit, batch_size=batch_size, backbone=backbone,
                              validation_fraction=validation_fraction, seed=seed, train_examples=len(train[0]),
                              validation_examples=len(val[0]), split=split,
                              space=params),
                  trials=ranked)
    path = os.path.join(out_dir, "best.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(config, handle, indent=2)
    os.replace(path + ".tmp", path)
    if verbose:
        print(format_summary(preset, ranked, objective))
        print(f"best: trial {best['trial_id']}, {objective} {best['score']:.4f}, learning_rate "
              f"{best['learning_rate']:.4g}, head_kwargs {best['head_kwargs']}; written to {path}")
    return config


