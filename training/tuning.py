"""Hyper-parameter search for a preset's head with keras-tuner (``otzoo tune PRESET``).

:func:`tune` searches the head's own parameters (:func:`search_space`) and the learning rate by random search:
each trial builds the preset's architecture with the sampled head arguments, trains it for ``epochs`` epochs on
the training split minus a validation part carved from it (:func:`validation_split`; the test split is never
read), and is scored by its accuracy on that validation part. It prints a summary of the trials and writes the best
configuration as JSON (:data:`CONFIG_FORMAT`), which :func:`load_tuned_config` reads back for ``otzoo train``.

Search spaces by head (the vocabulary of ``docs/api.md``):

- ``mpw`` (MultiProxyWasserstein): ``epsilon`` (log-uniform 0.02-0.5), ``num_proxies`` (1, 2, 4, 8);
- ``hyperspherical`` (DL2PA): ``dim`` (``num_classes - 1`` -- the simplex, the default --, 16, 32, 64);
- ``gsp`` pooling (retrieval): ``transport_ratio`` (0.1-0.9), ``num_prototypes`` (16, 32, 64, 128);
- ``emd`` (few-shot): ``scale`` (log-uniform 2-50; EMDHead's logit multiplier, the "temperature" of DeepEMD);
- ``gap_fc``: the learning rate only;

always with ``learning_rate`` (log-uniform, a decade either side of the recipe's, capped to 1e-4 .. 1).

Trials run for the classification presets (Fashion-MNIST); the spaces of the retrieval and few-shot heads are
defined here but their trials need those tasks' training recipes (``training/recipes.py``) and raise a
``ValueError`` saying so until they are wired.
"""
import json
import math
import os

import keras
import numpy as np

from ot_layers.validation import check_in_range, check_positive_int

CONFIG_FORMAT = "otzoo-tuning/1"
# The JSON written by ``tune`` (``OUT/best.json``):
#   {"format": "otzoo-tuning/1", "preset": NAME, "task": TASK,
#    "head_kwargs": {...},           # keyword arguments of the head layer (zoo.build(NAME, **head_kwargs))
#    "learning_rate": FLOAT,         # the recipe's initial learning rate to use instead
#    "objective": "val_accuracy", "score": FLOAT, "search": {...how it was searched...},
#    "trials": [{"trial_id", "score", "head_kwargs", "learning_rate"}, ...best first]}
# Only "preset", "head_kwargs" and "learning_rate" are read back (load_tuned_config); the rest documents the search.
OBJECTIVE = "val_accuracy"


def search_space(spec):
    """The parameters searched for a preset ``spec`` (an entry of ``zoo.registry.PRESETS``): a list of dicts
    ``{"name", "target": "head" | "optimizer", "kind": "log" | "linear" | "choice", "low", "high" | "values"}``."""
    head = spec.get("head") or spec.get("pooling")
    recipe_rate = float(spec.get("recipe", {}).get("learning_rate", 0.01))
    params = []
    if head == "mpw":
        params += [dict(name="epsilon", target="head", kind="log", low=0.02, high=0.5),
                   dict(name="num_proxies", target="head", kind="choice", values=[1, 2, 4, 8])]
    elif head == "hyperspherical":
        simplex = max(2, int(spec["num_classes"]) - 1)
        params += [dict(name="dim", target="head", kind="choice", values=sorted({simplex, 16, 32, 64}))]
    elif head == "gsp":
        params += [dict(name="transport_ratio", target="head", kind="linear", low=0.1, high=0.9),
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
        raise ValueError(f"`validation_fraction` {fraction} of {len(labels)} examples holds out no example; use "
                         "more examples (`limit`) or a larger fraction.")
    keep = np.setdiff1d(np.arange(len(labels)), held)
    return (images[keep], labels[keep]), (images[held], labels[held])


class _ValidationAccuracy(keras.callbacks.Callback):
    """Adds ``val_accuracy`` of ``classifier`` (the served model: images -> logits) on the held-out part to each
    epoch's logs, before the tuner's callbacks read it."""

    def __init__(self, classifier, images, labels, batch_size):
        super().__init__()
        self.classifier, self.images, self.labels, self.batch_size = classifier, images, labels, batch_size

    def on_epoch_end(self, epoch, logs=None):
        logits = self.classifier.predict(self.images, batch_size=self.batch_size, verbose=0)
        if logs is not None:
            logs[OBJECTIVE] = float(np.mean(np.argmax(logits, axis=-1) == self.labels))


def _classification_hypermodel(name, spec, params, data, epochs, batch_size, backbone):
    import keras_tuner as kt

    import zoo
    from training.pipelines import image_dataset
    from training.recipes import classification_training

    recipe = spec.get("recipe", {})
    (x_train, y_train), (x_val, y_val) = data
    steps = max(1, len(x_train) // batch_size) * epochs

    class PresetHyperModel(kt.HyperModel):
        def build(self, hp):
            values = {p["name"]: _sample(hp, p) for p in params}
            head_kwargs = {p["name"]: values[p["name"]] for p in params if p["target"] == "head"}
            classifier = zoo.build(name, **({"backbone": backbone} if backbone else {}), **head_kwargs)
            schedule = keras.optimizers.schedules.CosineDecay(values["learning_rate"], decay_steps=steps)
            optimizer = keras.optimizers.SGD(schedule, momentum=recipe.get("momentum", 0.9),
                                             nesterov=recipe.get("nesterov", False))
            model, loss, self.head_callbacks, self.feed = classification_training(name, classifier)
            model.compile(optimizer, loss)
            self.classifier = classifier  # the served model of the trial being built, fitted next
            return model

        def fit(self, hp, model, *args, callbacks=None, **kwargs):
            callbacks = (self.head_callbacks + [_ValidationAccuracy(self.classifier, x_val, y_val, 256)]
                         + list(callbacks or []))
            train = image_dataset(x_train, y_train, batch_size, training=True, pad=recipe.get("pad", 2),
                                  seed=recipe.get("seed", 0)).map(self.feed)
            return model.fit(train, epochs=epochs, callbacks=callbacks, verbose=kwargs.get("verbose", 0))

    return PresetHyperModel()


def _trial_config(trial, params):
    values = trial.hyperparameters.values
    return dict(trial_id=trial.trial_id, score=None if trial.score is None else float(trial.score),
                head_kwargs={p["name"]: values[p["name"]] for p in params if p["target"] == "head"},
                learning_rate=float(values["learning_rate"]))


def format_summary(preset, trials):
    """The trial table :func:`tune` prints: rank, trial, validation accuracy, learning rate, head arguments."""
    lines = [f"otzoo tune {preset}: {len(trials)} trial(s), best first (score: {OBJECTIVE})",
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
    ``resume``: continue a search in ``out_dir`` instead of starting over; ``verbose``: 1 prints keras-tuner's
    per-trial progress and the summary, 0 nothing.
    """
    import keras_tuner as kt

    from training.data import load_fashion_mnist
    from zoo.registry import PRESETS

    if preset not in PRESETS:
        raise ValueError(f"`preset` {preset!r} is unknown; known presets: {', '.join(sorted(PRESETS))}.")
    trials = check_positive_int("trials", trials)
    epochs = check_positive_int("epochs", epochs)
    if limit is not None:
        limit = check_positive_int("limit", limit)
    spec = PRESETS[preset]
    batch_size = check_positive_int("batch_size", batch_size or spec.get("recipe", {}).get("batch_size", 128))
    if spec["task"] != "classification":
        raise ValueError(f"`preset` {preset!r} is a {spec['task']} preset: its search space is defined "
                         f"({[p['name'] for p in search_space(spec)]}) but its trials need the {spec['task']} "
                         "training recipe, not wired into tuning yet.")
    if spec.get("dataset") != "fashion_mnist":
        raise ValueError(f"`preset` {preset!r}: tuning reads Fashion-MNIST only, not {spec.get('dataset')!r}.")
    keras.utils.set_random_seed(seed)
    images, labels = load_fashion_mnist("train", limit=limit, normalize=False)  # never the test split
    train, val = validation_split(images, labels, validation_fraction, seed)
    if len(train[0]) < batch_size:
        raise ValueError(f"`batch_size` {batch_size} is larger than the {len(train[0])} training examples left "
                         "after the validation split; lower it or raise `limit`.")
    params = search_space(spec)
    hypermodel = _classification_hypermodel(preset, spec, params, (train, val), epochs, batch_size, backbone)
    os.makedirs(out_dir, exist_ok=True)
    tuner = kt.RandomSearch(hypermodel, objective=kt.Objective(OBJECTIVE, direction="max"), max_trials=trials,
                            seed=seed, directory=os.path.join(out_dir, "tuner"), project_name=preset,
                            overwrite=not resume)
    tuner.search(verbose=verbose)
    done = [t for t in tuner.oracle.trials.values() if t.status == "COMPLETED"]
    if not done:
        raise ValueError(f"`preset` {preset!r}: every trial failed; see keras-tuner's messages above.")
    ranked = sorted((_trial_config(t, params) for t in tuner.oracle.trials.values()),
                    key=lambda t: -math.inf if t["score"] is None else t["score"], reverse=True)
    best = ranked[0]
    config = dict(format=CONFIG_FORMAT, preset=preset, task=spec["task"], head_kwargs=best["head_kwargs"],
                  learning_rate=best["learning_rate"], objective=OBJECTIVE, score=best["score"],
                  search=dict(trials=trials, epochs=epochs, limit=limit, batch_size=batch_size, backbone=backbone,
                              validation_fraction=validation_fraction, seed=seed, train_examples=len(train[0]),
                              validation_examples=len(val[0]), split="train (validation carved from it)",
                              space=params),
                  trials=ranked)
    path = os.path.join(out_dir, "best.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(config, handle, indent=2)
    os.replace(path + ".tmp", path)
    if verbose:
        print(format_summary(preset, ranked))
        print(f"best: trial {best['trial_id']}, {OBJECTIVE} {best['score']:.4f}, learning_rate "
              f"{best['learning_rate']:.4g}, head_kwargs {best['head_kwargs']}; written to {path}")
    return config


def load_tuned_config(path, preset=None):
    """Read a configuration written by :func:`tune`: ``{"preset", "head_kwargs", "learning_rate", ...}``.

    ``preset``: when given, the file must be for that preset. Bad files raise ``ValueError`` naming ``config``.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`config`: no tuning result at {path!r} (run `otzoo tune PRESET --out DIR`).")
    try:
        with open(path) as handle:
            config = json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"`config` {path!r} is not valid JSON ({error}).") from None
    ok = isinstance(config, dict) and isinstance(config.get("preset"), str) \
        and isinstance(config.get("head_kwargs"), dict) and isinstance(config.get("learning_rate"), (int, float)) \
        and config["learning_rate"] > 0
    if not ok:
        raise ValueError(f"`config` {path!r} must hold 'preset' (str), 'head_kwargs' (dict) and 'learning_rate' "
                         "(> 0), as written by `otzoo tune`.")
    if preset is not None and config["preset"] != preset:
        raise ValueError(f"`config` {path!r} was tuned for preset {config['preset']!r}, not {preset!r}.")
    return config
