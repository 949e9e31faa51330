"""One run of the validation protocol: a preset trained by its recipe on training images with a validation part held
out, and scored on that part. ``otzoo tune``'s trials (:mod:`training.tuning.search`) and the budget selection of
``experiments/gpu_presets.py`` train and score through it, so both follow the recipe ``otzoo train`` follows: the
backbone's weight decay (``recipe.l2``), the task's loss and layer-state callbacks, the optimizer and schedule over
the run's steps, the augmentation, and the step compiled as the backend allows (``compiled_step``). The batches are
``tf.data`` on TensorFlow and NumPy (``ArrayBatches``) on JAX and PyTorch (``array_batches``), so a trial runs on
every backend, TensorFlow installed or not.

What is held out, and how it is scored, is the task's (its recipe module's ``tuning_data``, ``tuning_parts`` and
``tuning_score``): a class-stratified share of the images scored by accuracy (classification), or whole seen classes
scored by MAP@R among them (retrieval)."""
from dataclasses import dataclass
from typing import Any

import keras

from training.data.pipelines import array_batches, predict_batches
from training.recipes import recipe_for
from training.recipes.components import compiled_step, make_optimizer
from zoo.loading import L2_BACKBONES, build


@dataclass
class Trial:
    """A trial ready to train: ``served`` (images -> logits or embeddings, the model scored), ``trained`` (the model
    ``fit`` trains, compiled; ``served`` itself or a model around it), the recipe's layer-state ``callbacks`` (to
    run before any other callback, so that a backup holds their state) and the training ``batches`` fed as
    ``trained`` takes them."""
    served: keras.Model
    trained: keras.Model
    callbacks: list
    batches: Any


def trial_setup(spec, train, head_kwargs=None, backbone=None):
    """Build and compile preset ``spec`` (a ``zoo.spec.PresetSpec`` whose recipe sets the run: ``epochs``,
    ``batch_size``, ``learning_rate``, ``seed`` of the batches, ...) to train on ``train`` ``(images, labels)``:
    a :class:`Trial`. ``head_kwargs``: the head's (retrieval: the pooling layer's) arguments to use instead of the
    preset's; ``backbone``: a ``zoo.BACKBONES`` name to use instead of the preset's (the recipe's weight decay
    ``l2`` applies to the ResNet backbones, ``zoo.loading.L2_BACKBONES``, and is left out for the others). The
    caller seeds the initialization (``keras.utils.set_random_seed``) and checks that ``train`` holds one batch."""
    recipe, task = spec.recipe, recipe_for(spec.task)
    images, labels = train
    overrides = dict(head_kwargs or {}, **({"backbone": backbone} if backbone else {}))
    served = build(spec, l2=trial_weight_decay(spec, backbone), **overrides)
    trained, loss, callbacks, feed = task.tuning_parts(spec, served, train, recipe)
    steps = len(images) // recipe.batch_size * recipe.epochs
    trained.compile(optimizer=make_optimizer(recipe, steps), loss=loss, jit_compile=compiled_step(recipe.jit_compile))
    batches = array_batches(images, labels, recipe.batch_size, training=True, augment=recipe.augment, pad=recipe.pad,
                            seed=recipe.seed)
    return Trial(served, trained, list(callbacks), batches.map(feed) if feed is not None else batches)


def trial_weight_decay(spec, backbone=None):
    """The L2 penalty a trial of ``spec`` puts on its backbone's kernels: the recipe's ``l2`` on a ResNet backbone
    (``zoo.loading.L2_BACKBONES``), none on a ``backbone`` swapped in for a quick search."""
    return float(spec.recipe.l2) if (backbone or spec.architecture.backbone) in L2_BACKBONES else 0.0


def trial_score(spec, served, validation):
    """The task's validation score (accuracy, or MAP@R for retrieval) of the ``served`` model of preset ``spec`` on
    ``validation`` ``(images, labels)``."""
    images, labels = validation
    outputs, _ = predict_batches(served, array_batches(images, labels, 256))
    return float(recipe_for(spec.task).tuning_score(outputs, labels))
