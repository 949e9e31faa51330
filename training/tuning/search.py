"""Hyper-parameter search for a preset's head with keras-tuner (``otzoo tune PRESET``).

:func:`tune` searches the head's own parameters (:func:`search_space`) and the learning rate by random search:
each trial builds the preset's architecture with the sampled head arguments, trains it for ``epochs`` epochs on
the training split minus a validation part carved from it (the test split is never read), and is scored on that
validation part:

- classification presets: a class-stratified share of the training images (:func:`validation_split`), scored by
  accuracy (``val_accuracy``);
- retrieval presets: whole seen classes held out (:func:`held_out_classes_split`, the retrieval protocol one level
  down: the trial trains on the other seen classes and is scored by cosine-retrieval MAP@R among the held-out
  classes' training images, ``val_map_at_r``). It prints a summary of the trials and writes the best
configuration as JSON (:data:`CONFIG_FORMAT`), which :func:`load_tuned_config` reads back for ``otzoo train``.

Search spaces by head (the vocabulary of ``docs/api.md``):

- ``mpw`` (MultiProxyWasserstein): ``epsilon`` (log-uniform 0.02-0.5), ``num_proxies`` (1, 2, 4, 8);
- ``hyperspherical`` (DL2PA): ``dim`` (``num_classes - 1`` -- the simplex, the default --, 16, 32, 64);
- ``gsp`` pooling (retrieval): ``epsilon`` (log-uniform 0.05-2.0; the thesis' ``1 / gamma``), ``transport_ratio``
  (0.1-0.9), ``num_prototypes`` (16, 32, 64, 128);
- ``gap`` pooling (retrieval): the learning rate only;
- ``emd`` (few-shot): ``scale`` (log-uniform 2-50; EMDHead's logit multiplier, the "temperature" of DeepEMD);
- ``gap_fc``: the learning rate only;

always with ``learning_rate`` (log-uniform, a decade either side of the recipe's, capped to 1e-4 .. 1).

Trials run for the classification and retrieval presets (Fashion-MNIST); the few-shot head's space is defined here
but its trials need the episodic recipe and raise a ``ValueError`` saying so.
"""
import dataclasses
import json
import math
import os

import keras
import numpy as np

import zoo
from ot_layers.optional import require
from ot_layers.validation import check_in_range, check_positive_int
from training.data.errors import EmptySliceError
from training.data.fashion_mnist import fashion_mnist_split, load_fashion_mnist
from training.data.pipelines import image_dataset
from training.evaluation.retrieval import retrieval_metrics
from training.recipes.classification import classification_training
from training.recipes.components import make_callbacks, make_optimizer
from training.recipes.retrieval import retrieval_training
from training.recipes.tuned_config import CONFIG_FORMAT
from zoo.registry import PRESETS

# The JSON written by ``tune`` (``OUT/best.json``):
#   {"format": "otzoo-tuning/1", "preset": NAME, "task": TASK,
#    "head_kwargs": {...},           # keyword arguments of the head layer (zoo.build(NAME, **head_kwargs))
#    "learning_rate": FLOAT,         # the recipe's initial learning rate to use instead
#    "objective": "val_accuracy" | "val_map_at_r", "score": FLOAT, "search": {...how it was searched...},
#    "trials": [{"trial_id", "score", "head_kwargs", "learning_rate"}, ...best first]}
# Only "preset", "head_kwargs" and "learning_rate" are read back (load_tuned_config); the rest documents the search.
OBJECTIVES = {"classification": "val_accuracy", "retrieval": "val_map_at_r"}
VALIDATION_IMAGES_PER_CLASS = 1000  # retrieval: images of each held-out class that score a trial


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


def validation_split(images, labels, fraction=0.2, seed=0):
    """``(train_images, train_labels), (val_images, val_labels)``: a seeded, class-stratified ``fraction`` of the
    given *training* examples held out for scoring trials (each class keeps at least one training example)."""
    fraction = check_in_range("validation_fraction", fraction, 0.0, 1.0, low_open=True, high_open=True)
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    held = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        count = min(len(members) - 1, int(round(fraction * len(members))))
        held.extend(members[:count].tolist())
    held = np.sort(np.asarray(held, dtype=np.int64))
    if len(held) == 0:
        raise EmptySliceError(f"`validation_fraction` {fraction} of {len(labels)} examples holds out no example; "
                              "use more examples (`limit`) or a larger fraction.")
    keep = np.setdiff1d(np.arange(len(labels)), held)
    return (images[keep], labels[keep]), (images[held], labels[held])


def held_out_classes_split(images, labels, fraction=0.2, per_class=VALIDATION_IMAGES_PER_CLASS):
    """The retrieval protocol on the seen classes: ``(fit_images, fit_labels), (val_images, val_labels)``.

    The last ``max(2, round(fraction * C))`` of the ``C`` classes in ``labels`` are held out: their first
    ``per_class`` images (original labels) score the trial by retrieval among unseen classes; the other classes'
    images train it (labels ``0..C'-1`` in increasing order). At least two classes must remain to train on."""
    fraction = check_in_range("validation_fraction", fraction, 0.0, 1.0, low_open=True, high_open=True)
    labels = np.asarray(labels)
    classes = np.unique(labels)
    count = max(2, int(round(fraction * len(classes))))
    if len(classes) - count < 2:
        raise EmptySliceError(f"`validation_fraction` {fraction}: holding out {count} of the {len(classes)} seen "
                              "classes leaves fewer than two to train on; use more classes or a smaller fraction.")
    fit_classes, val_classes = classes[:-count], classes[-count:]
    fit_mask = np.isin(labels, fit_classes)
    relabel = np.searchsorted(fit_classes, labels[fit_mask]).astype(np.int32)
    held = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in val_classes])
    return (images[fit_mask], relabel), (images[held], labels[held])


def _accuracy(logits, labels):
    return np.mean(np.argmax(logits, axis=-1) == labels)


def _map_at_r(embeddings, labels):

    return retrieval_metrics(embeddings, labels, metric="cosine", nmi=False)["map_at_r"]


# What scores a trial, by task: the served model's outputs on the validation images and their labels -> a number
# (accuracy of the logits; MAP@R of cosine retrieval among the held-out classes, every image a query).
SCORES = {"classification": _accuracy, "retrieval": _map_at_r}


class _ValidationScore(keras.callbacks.Callback):
    """Adds the task's objective (``val_accuracy`` or ``val_map_at_r``) of ``served`` (the served model: images ->
    logits or embeddings) on the validation images to each epoch's logs, before the tuner's callbacks read it."""

    def __init__(self, task, served, images, labels, batch_size=256):
        super().__init__()
        self.task, self.served, self.images, self.labels, self.batch_size = task, served, images, labels, batch_size

    def on_epoch_end(self, epoch, logs=None):
        outputs = self.served.predict(self.images, batch_size=self.batch_size, verbose=0)
        if logs is not None:
            logs[OBJECTIVES[self.task]] = float(SCORES[self.task](outputs, self.labels))


def _task_parts(name, spec, served, data, recipe):
    """``(model fit trains, loss, callbacks before the scorer, batch feed or None, scorer)`` of one trial."""
    (x_train, y_train), (x_val, y_val) = data
    if spec.task == "retrieval":
        model, loss = retrieval_training(spec, served, recipe, num_classes=int(y_train.max()) + 1)
        head_callbacks = make_callbacks(recipe, served, x_train)  # e.g. GSP's prototype initialization
        return model, loss, head_callbacks, None, _ValidationScore("retrieval", served, x_val, y_val)

    model, loss, head_callbacks, feed = classification_training(spec, served, recipe)
    return model, loss, head_callbacks, feed, _ValidationScore("classification", served, x_val, y_val)


def _preset_hypermodel(name, spec, params, data, epochs, batch_size, backbone):
    kt = require("keras_tuner", "tune", "otzoo tune")


    recipe = spec.recipe
    x_train, y_train = data[0]
    steps = max(1, len(x_train) // batch_size) * epochs

    class PresetHyperModel(kt.HyperModel):
        def build(self, hp):
            values = {p["name"]: _sample(hp, p) for p in params}
            head_kwargs = {p["name"]: values[p["name"]] for p in params if p["target"] == "head"}
            served = zoo.build(name, **({"backbone": backbone} if backbone else {}), **head_kwargs)
            optimizer = make_optimizer(dataclasses.replace(recipe, learning_rate=values["learning_rate"]), steps)
            model, loss, self.head_callbacks, self.feed, self.scorer = _task_parts(name, spec, served, data, recipe)
            model.compile(optimizer, loss)
            return model

        def fit(self, hp, model, *args, callbacks=None, **kwargs):
            callbacks = self.head_callbacks + [self.scorer] + list(callbacks or [])
            train = image_dataset(x_train, y_train, batch_size, training=True, pad=recipe.pad, seed=recipe.seed,
                                  augment=recipe.augment)
            if self.feed is not None:
                train = train.map(self.feed)
            return model.fit(train, epochs=epochs, callbacks=callbacks, verbose=kwargs.get("verbose", 0))

    return PresetHyperModel()


def _split(split, images, labels, limit, *args):
    """``split(images, labels, *args)``, its :class:`EmptySliceError` naming ``limit`` when one was given."""
    try:
        return split(images, labels, *args)
    except EmptySliceError as error:
        if limit is None:
            raise
        raise EmptySliceError(f"{len(labels)} training images; {error}", "limit", limit) from None


def _trial_config(trial, params):
    values = trial.hyperparameters.values
    return dict(trial_id=trial.trial_id, score=None if trial.score is None else float(trial.score),
                head_kwargs={p["name"]: values[p["name"]] for p in params if p["target"] == "head"},
                learning_rate=float(values["learning_rate"]))


def format_summary(preset, trials, objective=OBJECTIVES["classification"]):
    """The trial table :func:`tune` prints: rank, trial, validation score, learning rate, head arguments."""
    lines = [f"otzoo tune {preset}: {len(trials)} trial(s), best first (score: {objective})",
             f"{'rank':>4}  {'trial':>5}  {'score':>7}  {'learning_rate':>13}  head_kwargs"]
    for rank, t in enumerate(trials, 1):
        score = "failed" if t["score"] is None else f"{t['score']:.4f}"
        kwargs = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in t["head_kwargs"].items())
        lines.append(f"{rank:>4}  {t['trial_id']:>5}  {score:>7}  {t['learning_rate']:>13.4g}  {kwargs or '-'}")
    return "\n".join(lines)


def tune(preset, trials, out_dir, epochs=1, limit=None, batch_size=None, backbone=None, validation_fraction=0.2,
         seed=0, resume=False, verbose=1):
    """Random search over the head's parameters and the learning rate of ``preset``; returns the best
    configuration (also written to ``out_dir/best.json``, format :data:`CONFIG_FORMAT`).

    ``trials``: how many configurations are trained; ``epochs`` per trial; ``limit``: use the first ``limit``
    training images (the validation part is carved from them); ``batch_size``: default the recipe's;
    ``backbone``: a ``zoo.BACKBONES`` name replacing the preset's (e.g. ``"small_convnet"`` for quick searches);
    ``validation_fraction``: the share of the training images (classification) or of the seen classes (retrieval,
    at least two classes) held out to score trials; ``resume``: continue a search in ``out_dir`` instead of
    starting over; ``verbose``: 1 prints keras-tuner's per-trial progress and the summary, 0 nothing. A GSP
    retrieval trial pools like GAP during its first epoch (the warm-up of ``GSPPrototypeInit``): give it
    ``epochs >= 2``.
    """
    kt = require("keras_tuner", "tune", "otzoo tune")


    if preset not in PRESETS:
        raise ValueError(f"`preset` {preset!r} is unknown; known presets: {', '.join(sorted(PRESETS))}.")
    trials = check_positive_int("trials", trials)
    epochs = check_positive_int("epochs", epochs)
    if limit is not None:
        limit = check_positive_int("limit", limit)
    spec = PRESETS[preset]
    batch_size = check_positive_int("batch_size", batch_size or spec.recipe.batch_size)
    if spec.task not in OBJECTIVES:
        raise ValueError(f"`preset` {preset!r} is a {spec.task} preset: its search space is defined "
                         f"({[p['name'] for p in search_space(spec)]}) but its trials need the {spec.task} "
                         "training recipe, not wired into tuning yet.")
    objective = OBJECTIVES[spec.task]
    if spec.data.dataset != "fashion_mnist":
        raise ValueError(f"`preset` {preset!r}: tuning reads Fashion-MNIST only, not {spec.data.dataset!r}.")
    keras.utils.set_random_seed(seed)
    if spec.task == "retrieval":  # the seen classes' training images, never the test split
        images, labels = fashion_mnist_split("retrieval", "train", limit=limit, normalize=False)
        train, val = _split(held_out_classes_split, images, labels, limit, validation_fraction)
        split = (f"training images of the seen classes: classes {sorted(set(np.unique(val[1]).tolist()))} held "
                 f"out (first {VALIDATION_IMAGES_PER_CLASS} images each) to score retrieval, the others trained on")
    else:
        images, labels = load_fashion_mnist("train", limit=limit, normalize=False)  # never the test split
        train, val = _split(validation_split, images, labels, limit, validation_fraction, seed)
        split = "train (validation carved from it)"
    if len(train[0]) < batch_size:
        raise EmptySliceError(f"{len(train[0])} training examples left after the validation split, fewer than one "
                              f"batch of {batch_size}; lower `batch_size` or raise `limit`",
                              *(("limit", limit) if limit is not None else ("batch_size", batch_size)))
    params = search_space(spec)
    hypermodel = _preset_hypermodel(preset, spec, params, (train, val), epochs, batch_size, backbone)
    os.makedirs(out_dir, exist_ok=True)
    tuner = kt.RandomSearch(hypermodel, objective=kt.Objective(objective, direction="max"), max_trials=trials,
                            seed=seed, directory=os.path.join(out_dir, "tuner"), project_name=preset,
                            overwrite=not resume)
    tuner.search(verbose=verbose)
    done = [t for t in tuner.oracle.trials.values() if t.status == "COMPLETED"]
    if not done:
        raise ValueError(f"`preset` {preset!r}: every trial failed; see keras-tuner's messages above.")
    ranked = sorted((_trial_config(t, params) for t in tuner.oracle.trials.values()),
                    key=lambda t: -math.inf if t["score"] is None else t["score"], reverse=True)
    best = ranked[0]
    config = dict(format=CONFIG_FORMAT, preset=preset, task=spec.task, head_kwargs=best["head_kwargs"],
                  learning_rate=best["learning_rate"], objective=objective, score=best["score"],
                  search=dict(trials=trials, epochs=epochs, limit=limit, batch_size=batch_size, backbone=backbone,
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


