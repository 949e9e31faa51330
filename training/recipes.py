"""The recipes that train the zoo's presets (``otzoo train PRESET``): data, optimizer, schedule, checkpoints, card.

A run writes into ``out_dir``: ``backup/`` (``keras.callbacks.BackupAndRestore``, so a killed run resumes at its
last finished epoch), ``log.csv`` (per-epoch metrics), and at the end ``model.weights.h5`` and ``metadata.json``.
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
from training.pipelines import image_dataset
from zoo.loading import sha256_of
from zoo.registry import PRESETS


def hardware_description():
    return f"{platform.machine()} CPU x{os.cpu_count()}" + "".join(
        f", {d.name}" for d in tf.config.list_physical_devices("GPU"))


def default_strategy():
    """All local GPUs (``MirroredStrategy``) when there are some, else the default (one-device) strategy."""
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def sgd_cosine(recipe, steps):
    schedule = keras.optimizers.schedules.CosineDecay(recipe["learning_rate"], decay_steps=steps)
    return keras.optimizers.SGD(schedule, momentum=recipe["momentum"], nesterov=recipe["nesterov"])


def train_classification_preset(name, out_dir, epochs=None, batch_size=None, limit=None, seed=None, verbose=2):
    """Train preset ``name`` by its recipe; returns the model card (also written to ``out_dir/metadata.json``).

    ``epochs``, ``batch_size``, ``seed``: override the recipe's (``seed`` sets the initialization and data order).
    """
    from zoo.loading import build

    spec = PRESETS[name]
    recipe = dict(spec["recipe"])
    if epochs is not None:
        recipe["epochs"] = epochs
    if batch_size is not None:
        recipe["batch_size"] = batch_size
    if seed is not None:
        recipe["seed"] = int(seed)
    os.makedirs(out_dir, exist_ok=True)
    keras.utils.set_random_seed(recipe["seed"])
    x_train, y_train = load_fashion_mnist("train", limit=limit, normalize=False)
    x_test, y_test = load_fashion_mnist("test", normalize=False)
    train = image_dataset(x_train, y_train, recipe["batch_size"], training=True, pad=recipe["pad"],
                          seed=recipe["seed"])
    test = image_dataset(x_test, y_test, 256)
    steps = len(x_train) // recipe["batch_size"]
    strategy = default_strategy()
    with strategy.scope():
        model = build(name, l2=recipe["l2"])
        model.compile(optimizer=sgd_cosine(recipe, steps * recipe["epochs"]),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                      jit_compile=recipe["jit_compile"])
    callbacks = [keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")),
                 keras.callbacks.CSVLogger(os.path.join(out_dir, "log.csv"), append=True)]
    start = time.time()
    model.fit(train, epochs=recipe["epochs"], validation_data=test, callbacks=callbacks, verbose=verbose)
    train_time = time.time() - start
    _, accuracy = model.evaluate(test, verbose=0)
    weights = os.path.join(out_dir, "model.weights.h5")
    model.save_weights(weights)
    card = dict(name=name, task=spec["task"], dataset=spec["dataset"], split=spec["split"],
                description=spec["description"], recipe=recipe, metrics={"accuracy": round(float(accuracy), 4)},
                parameters=int(model.count_params()), weights_sha256=sha256_of(weights),
                train_time_s=round(train_time, 1), hardware=hardware_description(),
                strategy=type(strategy).__name__, command=" ".join([f"otzoo train {name}"] + [f"--{flag} {value}" for flag, value in (
                    ("epochs", epochs), ("batch-size", batch_size), ("limit", limit), ("seed", seed)) if value is not None]),
                date=datetime.date.today().isoformat(),
                note="train_time_s counts this process only (a resumed run restarts the clock)")
    with open(os.path.join(out_dir, "metadata.json"), "w") as handle:
        json.dump(card, handle, indent=2)
    return card


def evaluate_classification_preset(name, weights=None, limit=None, batch_size=256):
    """Test accuracy of preset ``name`` (pretrained, or ``weights``) on the first ``limit`` (all by default)
    Fashion-MNIST test images, next to the card's."""
    from zoo.loading import load, model_card

    model = load(name, weights=weights)
    x_test, y_test = load_fashion_mnist("test", limit=limit, normalize=False)
    logits = model.predict(image_dataset(x_test, y_test, batch_size), verbose=0)
    accuracy = float(np.mean(np.argmax(logits, axis=-1) == y_test))
    return dict(metrics={"accuracy": accuracy}, card_metrics=model_card(name).get("metrics"),
                examples=len(y_test))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Train a zoo preset by its recipe.")
    parser.add_argument("name", choices=sorted(PRESETS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    print(json.dumps(train_classification_preset(args.name, args.out, epochs=args.epochs, seed=args.seed),
                     indent=2))
