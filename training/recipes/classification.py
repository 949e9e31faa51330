"""The classification presets' recipe: train on the training split by the recipe's loss (cross-entropy, or a head's
own loss), report test accuracy.

:func:`training_setup` assembles everything a run trains with from the preset's spec (the model, the compiled
optimizer and loss, the layer callbacks, the data pipelines) without training; :func:`train` runs it. The other
commands reach this task through the same module: :func:`fine_tune_setup` (``otzoo fine-tune``), the tuning pieces
:data:`TUNING_OBJECTIVE`, :func:`tuning_data`, :func:`tuning_parts`, :func:`tuning_score` (``otzoo tune``), and
:func:`check_evaluation_limit` (``otzoo evaluate --limit``).
"""
import time
from dataclasses import dataclass
from typing import Any, Callable, List

import keras
import numpy as np

from ot_layers.validation import check_labels
from training.data.datasets import Batches, image_batches
from training.data.fashion_mnist import load_fashion_mnist
from training.data.pipelines import array_batches, predict_batches
from training.distributed.fit import check_callbacks, fit
from training.recipes.common import (
    FineTuneSetup,
    current_strategy,
    check_fine_tune_batch,
    evaluation_target,
    fine_tune_images,
    merged_overrides,
    preset_spec,
    reproducing_command,
    run_options,
    standard_callbacks,
    write_preset,
)
from training.recipes.components import compiled_step, make_callbacks, make_loss, make_optimizer
from training.recipes.run_directory import claim_run_directory, run_identity
from training.recipes.validation import carve_validation, validation_split
from zoo.loading import build

# The ``otzoo train`` options beyond the common ones that this task's ``train`` accepts (``--config``: a best.json
# of ``otzoo tune``), and the ``otzoo evaluate`` ones its ``evaluate`` accepts.
TRAIN_OPTIONS = ("config",)
EVALUATE_OPTIONS = ()
# What ``otzoo tune`` maximizes: the served model's accuracy on a validation part of the training images.
TUNING_OBJECTIVE = "val_accuracy"


@dataclass
class TrainingSetup:
    """What a classification or retrieval run trains with: the preset's ``spec`` (recipe included), the served
    ``model``, the model ``fit`` trains (``trained``, compiled with ``optimizer`` and ``loss``), the recipe's layer
    ``callbacks``, the ``train`` and ``test`` :class:`training.data.datasets.Batches` (``test`` is ``None`` for
    retrieval runs, whose evaluation is retrieval among the unseen classes), the batch ``feed`` applied to them, and
    the optimizer ``steps`` of the whole run."""
    spec: Any
    model: keras.Model
    trained: keras.Model
    optimizer: Any
    loss: Any
    callbacks: List[keras.callbacks.Callback]
    train: Batches
    test: Any
    feed: Callable
    steps: int


def training_setup(spec, limit=None, strategy=None, head_overrides=None, data_dir=None):
    """The set-up of a run of classification preset ``spec`` (a ``zoo.spec.PresetSpec`` or a name), built and
    compiled under ``strategy`` (default the current one) without training: every recipe field is read here
    (optimizer, schedule, augment, loss, callbacks, ...). ``limit``: the first ``limit`` training images;
    ``head_overrides``: ``zoo.build``'s (a tuned configuration's head parameters)."""
    spec = preset_spec(spec)
    recipe, data = spec.recipe, spec.data
    keras.utils.set_random_seed(recipe.seed)
    image_size = data.input_shape[0]
    train = image_batches(data.dataset, "train", recipe.batch_size, training=True, augment=recipe.augment,
                          pad=recipe.pad, seed=recipe.seed, limit=limit, image_size=image_size, data_dir=data_dir)
    test = image_batches(data.dataset, "test", 256, image_size=image_size, data_dir=data_dir)
    steps = train.examples // recipe.batch_size * recipe.epochs
    strategy = current_strategy(strategy)
    with strategy.scope():
        model = build(spec, l2=recipe.l2, **(head_overrides or {}))
        trained, loss, feed = make_loss(recipe, spec.task, model, data.num_classes)
        optimizer = make_optimizer(recipe, steps)
        trained.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"], jit_compile=compiled_step(recipe.jit_compile))
    # Layer-state callbacks go before BackupAndRestore so that an epoch's backup holds that epoch's state.
    callbacks = make_callbacks(recipe, model, train.sample)
    return TrainingSetup(spec, model, trained, optimizer, loss, callbacks, train, test, feed, steps)


def classification_training(spec, model, recipe=None):
    """How classification preset ``spec`` (a spec or a name) trains ``model`` by ``recipe`` (default the preset's):
    ``(the model fit trains, its loss, the recipe's layer callbacks, how to feed it (x, y) batches)`` (the
    hyperspherical pull loss trains the ``[images, labels]`` model, with per-epoch re-assignment)."""
    spec = preset_spec(spec)
    recipe = recipe or spec.recipe
    trained, loss, feed = make_loss(recipe, "classification", model, spec.data.num_classes)
    return trained, loss, make_callbacks(recipe, model, None), feed


def train(name, out_dir, epochs=None, batch_size=None, limit=None, seed=None, verbose=2, strategy="auto",
          config=None, tensorboard=None, dataset=None, image_size=None, data_dir=None, recipe_overrides=None,
          callbacks=None, command=None):
    """Train classification preset ``name`` by its recipe; returns the model card (also written, with
    ``config.json`` and ``model.weights.h5``, into ``out_dir``).

    ``epochs``, ``batch_size``, ``seed``: override the recipe's (``seed`` sets the initialization and data order);
    ``limit``: train on the first ``limit`` training images; ``dataset``: a name of ``training.data.datasets.DATASETS``
    instead of the preset's (``image_size``: the TFDS images' side; ``data_dir``: the TFDS folder); ``strategy``,
    ``config``, ``tensorboard``: see :func:`run_options`. The run trains with ``training.distributed.fit.fit``
    (``model.fit``, or the multi-worker loop) and resumes from ``out_dir/backup``. ``callbacks``: more Keras
    callbacks for the run, after the recipe's own and the backup's. ``command``: the card's ``command``, by default
    the ``otzoo train`` command of these arguments (``--out out_dir`` among them); ``otzoo train`` gives the one it
    ran as.
    """
    callbacks = check_callbacks(callbacks)  # before the data are read and the model built
    strategy, head_overrides, learning_rate, extra_callbacks = run_options(name, strategy, config, tensorboard)
    spec = preset_spec(name, dataset=dataset, image_size=image_size, **merged_overrides(
        recipe_overrides, epochs=epochs, batch_size=batch_size, seed=seed, learning_rate=learning_rate))
    setup = training_setup(spec, limit=limit, strategy=strategy, head_overrides=head_overrides, data_dir=data_dir)
    claim_run_directory(out_dir, run_identity(spec, limit=limit, head=head_overrides))
    start = time.time()
    fit(setup.trained, setup.train.dataset.map(setup.feed), epochs=spec.recipe.epochs,
        validation_data=setup.test.dataset.map(setup.feed), verbose=verbose,
        callbacks=setup.callbacks + standard_callbacks(out_dir, setup.train.sample) + extra_callbacks
        + callbacks)
    train_time = time.time() - start
    accuracy = classification_accuracy(setup.model, setup.test.dataset)
    if command is None:
        command = reproducing_command(name, recipe_overrides, out=out_dir, dataset=dataset, image_size=image_size,
                                      epochs=epochs, batch_size=batch_size, limit=limit, seed=seed, config=config)
    return write_preset(setup.model, spec, out_dir, spec.recipe, {"accuracy": round(accuracy, 4)}, train_time,
                        strategy, command, head_overrides=head_overrides, limit=limit)


def classification_accuracy(model, images, labels=None, batch_size=256):
    """The share of images whose largest logit is at their label: ``images`` (raw pixels) with ``labels``, or a
    ``tf.data`` pipeline of ``(images, labels)`` batches. Any number of replicas (``predict_batches``: a last batch
    smaller than them is padded)."""
    if labels is not None:
        images = array_batches(images, labels, batch_size)
    logits, labels = predict_batches(model, images)
    if labels.size and (labels.min() < 0 or labels.max() >= logits.shape[-1]):  # never right: accuracy 0 silently
        raise ValueError(f"`labels` must be classes 0..{logits.shape[-1] - 1} of the model's logits, got labels "
                         f"from {labels.min()} to {labels.max()}.")
    return float(np.mean(np.argmax(logits, axis=-1) == labels))


def evaluate(preset, weights=None, limit=None, batch_size=256, data_dir=None):
    """Test accuracy of classification preset ``preset`` (a name: pretrained, or ``weights``; or a preset directory
    ``otzoo train`` wrote) on the first ``limit`` (all by default) test images of its data set, next to the card's:
    ``{"metrics", "card_metrics", "examples"}``."""
    model, spec, card = evaluation_target(preset, weights)
    test = image_batches(spec.data.dataset, "test", batch_size, limit=limit, image_size=spec.data.input_shape[0],
                         data_dir=data_dir)
    return dict(metrics={"accuracy": classification_accuracy(model, test.dataset)},
                card_metrics=card.get("metrics"), examples=test.examples)


def check_evaluation_limit(spec, limit):
    """``otzoo evaluate --limit``: nothing to check before evaluating; accuracy is defined on any non-empty slice
    of the test images (an empty one is the data loader's :class:`EmptySliceError`)."""


def fine_tune_setup(spec, model, limit, seed, batch_size, queries):
    """What ``otzoo fine-tune`` fits for classification preset ``spec`` (a spec or a name; a preset directory's spec
    carries its card's recipe): a :class:`FineTuneSetup` (the model fit trains, its loss, its training data, the same
    images without augmentation, what an epoch fits in words) from the served ``model`` (pretrained), by the recipe's
    loss (the hyperspherical head by its pull loss, with the labels as a second input; no re-assignment while
    fine-tuning) on the first ``limit`` Fashion-MNIST training images in shuffled batches of ``batch_size`` (``seed``;
    an incomplete last batch dropped). ``queries``: unused (few-shot episodes only). Raises :class:`EmptySliceError`
    naming ``limit`` when they cannot fill one batch."""
    images, labels = load_fashion_mnist("train", limit=limit, normalize=False)
    check_fine_tune_batch(images, batch_size, limit, "training images")
    trained, loss, _, feed = classification_training(spec, model)
    return FineTuneSetup(trained, loss, array_batches(images, labels, batch_size, training=True, seed=seed).map(feed),
                         array_batches(images, labels, batch_size).map(feed),
                         fine_tune_images(len(images), batch_size, "training images"))


def tuning_data(limit, validation_fraction, seed):
    """``(train, val, description)`` of an ``otzoo tune`` search: the first ``limit`` Fashion-MNIST training
    images (never the test split) split into ``(images, labels)`` to train the trials on and a seeded,
    class-stratified ``validation_fraction`` of them to score the trials."""
    images, labels = load_fashion_mnist("train", limit=limit, normalize=False)
    train, val = carve_validation(validation_split, images, labels, limit, validation_fraction, seed)
    return train, val, "train (validation carved from it)"


def tuning_parts(spec, served, train, recipe):
    """``(the model fit trains, its loss, the recipe's layer callbacks, how to feed it (x, y) batches)`` of one
    ``otzoo tune`` trial of classification preset ``spec`` on the ``served`` model (the trial's head arguments),
    by ``recipe``; ``train``: the trial's ``(images, labels)``."""
    return classification_training(spec, served, recipe)


def tuning_score(outputs, labels):
    """A trial's score (:data:`TUNING_OBJECTIVE`): the accuracy of the served model's logits ``outputs`` on the
    validation ``labels`` (``(N,)`` or ``(N, 1)``: a column of labels compared with ``(N,)`` predictions would
    broadcast to an ``(N, N)`` table)."""
    labels = check_labels(labels, "labels").reshape(-1)
    outputs = np.asarray(outputs)
    if outputs.ndim != 2 or len(outputs) != len(labels):
        raise ValueError(f"`outputs` must be logits (N, classes) for the {len(labels)} labels, got shape "
                         f"{outputs.shape}.")
    return np.mean(np.argmax(outputs, axis=-1) == labels)
