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
import time

import keras
import numpy as np
import tensorflow as tf

from training.data import load_fashion_mnist
from training.layer_signals import LayerSignals
from training.pipelines import image_dataset
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
    from training.strategies import make_strategy
    from training.tuning import load_tuned_config

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
    from training.strategies import is_chief, strategy_name, tf_config

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


def classification_training(name, model):
    """How classification preset ``name``'s ``model`` is trained: ``(the model fit trains, its loss, the head's
    state callbacks, how to feed it (x, y) batches)`` (the hyperspherical head trains its ``[images, labels]`` model
    with the pull loss and per-epoch re-assignment; the others the model itself with cross-entropy)."""
    if PRESETS[name]["head"] != "hyperspherical":
        return model, keras.losses.SparseCategoricalCrossentropy(from_logits=True), [], lambda x, y: (x, y)
    from ot_layers.callbacks import PrototypeReassignment
    from ot_layers.losses import HypersphericalPullLoss
    from zoo.models import hyperspherical_training_model

    # Put the re-assignment before BackupAndRestore so an epoch's backup holds that epoch's assignment.
    return (hyperspherical_training_model(model), HypersphericalPullLoss(),
            [PrototypeReassignment(layer_name="hyperspherical_head")], lambda x, y: ((x, y), y))


def train_classification_preset(name, out_dir, epochs=None, batch_size=None, limit=None, seed=None, verbose=2,
                                strategy="auto", config=None, tensorboard=None):
    """Train classification preset ``name`` by its recipe; returns the model card (also written to
    ``out_dir/metadata.json``).

    ``epochs``, ``batch_size``, ``seed``: override the recipe's (``seed`` sets the initialization and data order);
    ``limit``: train on the first ``limit`` training images; ``strategy``, ``config``, ``tensorboard``: see
    :func:`run_options`. The run trains with ``training.fit.fit`` (``model.fit``, or the multi-worker loop) and
    resumes from ``out_dir/backup``.
    """
    from training.fit import fit
    from zoo.loading import build

    strategy, head_overrides, learning_rate, extra_callbacks = run_options(name, strategy, config, tensorboard)
    recipe = preset_recipe(name, epochs=epochs, batch_size=batch_size, seed=seed, learning_rate=learning_rate)
    os.makedirs(out_dir, exist_ok=True)
    keras.utils.set_random_seed(recipe["seed"])
    x_train, y_train = load_fashion_mnist("train", limit=limit, normalize=False)
    x_test, y_test = load_fashion_mnist("test", normalize=False)
    steps = len(x_train) // recipe["batch_size"]
    with strategy.scope():
        model = build(name, l2=recipe["l2"], **head_overrides)
        trained, loss, head_callbacks, feed = classification_training(name, model)
        trained.compile(optimizer=sgd_cosine(recipe, steps * recipe["epochs"]), loss=loss, metrics=["accuracy"],
                        jit_compile=recipe["jit_compile"])
    if tensorboard:  # the layers' signals (e.g. Sinkhorn iterations) into the logs TensorBoard writes
        extra_callbacks.insert(0, LayerSignals(x_train[:64].astype("float32")))
    train = image_dataset(x_train, y_train, recipe["batch_size"], training=True, pad=recipe["pad"],
                          seed=recipe["seed"]).map(feed)
    test = image_dataset(x_test, y_test, 256).map(feed)
    start = time.time()
    fit(trained, train, epochs=recipe["epochs"], validation_data=test, verbose=verbose,
        callbacks=head_callbacks + extra_callbacks + standard_callbacks(out_dir))
    train_time = time.time() - start
    accuracy = classification_accuracy(model, x_test, y_test)
    return write_preset(model, name, out_dir, recipe, {"accuracy": round(accuracy, 4)}, train_time, strategy,
                        reproducing_command(name, epochs=epochs, batch_size=batch_size, limit=limit, seed=seed,
                                            config=config))


def classification_accuracy(model, images, labels, batch_size=256):
    """The share of ``images`` (raw pixels) whose largest logit is at their label."""
    logits = model.predict(image_dataset(images, labels, batch_size), verbose=0)
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


def evaluate_classification_preset(name, weights=None, limit=None, batch_size=256):
    """Test accuracy of preset ``name`` (pretrained, or ``weights``) on the first ``limit`` (all by default)
    Fashion-MNIST test images, next to the card's."""
    from zoo.loading import load, model_card

    model = load(name, weights=weights)
    x_test, y_test = load_fashion_mnist("test", limit=limit, normalize=False)
    return dict(metrics={"accuracy": classification_accuracy(model, x_test, y_test, batch_size)},
                card_metrics=model_card(name).get("metrics"), examples=len(y_test))


def train_preset(name, out_dir, **options):
    """Train preset ``name`` by its task's recipe (``options``: the overrides ``otzoo train`` offers, see each
    task's trainer); returns the card."""
    task = PRESETS[name]["task"]
    if task == "retrieval":
        from training.retrieval_recipe import train_retrieval_preset as trainer
    elif task == "few_shot":
        from training.few_shot_recipe import train_few_shot_preset as trainer
    else:
        options.pop("pretrained", None)
        trainer = train_classification_preset
    return trainer(name, out_dir, **options)


def evaluate_preset(name, weights=None, limit=None):
    """Recompute preset ``name``'s card metrics (``{"metrics", "card_metrics", "examples"}``)."""
    task = PRESETS[name]["task"]
    if task == "retrieval":
        from training.retrieval_recipe import evaluate_retrieval_preset as evaluator
    elif task == "few_shot":
        from training.few_shot_recipe import evaluate_few_shot_preset as evaluator
    else:
        evaluator = evaluate_classification_preset
    return evaluator(name, weights=weights, limit=limit)
