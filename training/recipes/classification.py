"""The classification presets' recipe: train on the training split by cross-entropy (or a head's own loss), report test accuracy."""
import os
import time

import keras
import numpy as np

from ot_layers.callbacks import PrototypeReassignment
from ot_layers.callbacks.layer_signals import LayerSignals
from ot_layers.losses import HypersphericalPullLoss
from training.data.fashion_mnist import load_fashion_mnist
from training.data.pipelines import image_dataset
from training.distributed.fit import fit
from training.recipes.common import (
    preset_recipe,
    reproducing_command,
    run_options,
    sgd_cosine,
    standard_callbacks,
    write_preset,
)
from zoo.loading import build, load, model_card
from zoo.models import hyperspherical_training_model
from zoo.registry import PRESETS


def classification_training(name, model):
    """How classification preset ``name``'s ``model`` is trained: ``(the model fit trains, its loss, the head's
    state callbacks, how to feed it (x, y) batches)`` (the hyperspherical head trains its ``[images, labels]`` model
    with the pull loss and per-epoch re-assignment; the others the model itself with cross-entropy)."""
    if PRESETS[name]["head"] != "hyperspherical":
        return model, keras.losses.SparseCategoricalCrossentropy(from_logits=True), [], lambda x, y: (x, y)

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

    model = load(name, weights=weights)
    x_test, y_test = load_fashion_mnist("test", limit=limit, normalize=False)
    return dict(metrics={"accuracy": classification_accuracy(model, x_test, y_test, batch_size)},
                card_metrics=model_card(name).get("metrics"), examples=len(y_test))


train = train_classification_preset
evaluate = evaluate_classification_preset
