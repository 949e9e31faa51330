"""The recipes that train the zoo's presets, one module per task over shared pieces (:mod:`.common`) and the
registries a recipe's named fields are read from (:mod:`.components`).

:data:`RECIPES` is the one table from a preset's task to its recipe module: ``otzoo train``, ``otzoo evaluate``,
``otzoo fine-tune`` and ``otzoo tune`` choose what a task does only through it (:func:`recipe_for`), never by
comparing task names, so a new task is one module and one entry. Each recipe module defines:

- ``training_setup(spec, ...)``: everything a run trains with, built without training; ``train(name, out_dir,
  **options)``; ``evaluate(preset, weights=None, limit=None, ...)`` (``preset``: a name or a preset directory
  ``otzoo train`` wrote);
- ``TRAIN_OPTIONS`` and ``EVALUATE_OPTIONS``: the ``otzoo train`` / ``otzoo evaluate`` options beyond the common
  ones that its ``train`` / ``evaluate`` accept (e.g. ``("episodes", "pretrained")``); the command line refuses the
  others for its presets;
- ``check_evaluation_limit(spec, limit)``: raises ``training.data.errors.EmptySliceError`` naming ``limit`` when the
  first ``limit`` test images cannot give the task's metrics;
- ``fine_tune_setup(spec, model, limit, seed, batch_size, queries)``: a ``common.FineTuneSetup`` (the model fit
  trains, its loss, its training data, the same data without augmentation, what an epoch fits in words) for ``otzoo
  fine-tune`` (:mod:`.fine_tune`; ``spec`` a preset's spec or name);
- ``TUNING_OBJECTIVE``: the validation metric ``otzoo tune`` maximizes, or ``None`` for a task that is not tunable;
  when it is set, ``tuning_data(limit, validation_fraction, seed)`` (``(train, val, description)``),
  ``tuning_parts(spec, served, train, recipe)`` (``(model fit trains, loss, callbacks, batch feed or None)``) and
  ``tuning_score(outputs, labels)`` (``training.tuning.search``).
"""
import os

from ot_layers.validation import check_output_path
from training.recipes import classification, few_shot, retrieval
from training.recipes.common import evaluation_spec, preset_card
from zoo.registry import PRESETS

RECIPES = {"classification": classification, "retrieval": retrieval, "few_shot": few_shot}


def recipe_for(task):
    """The recipe module of ``task``."""
    if task not in RECIPES:
        raise ValueError(f"`task` must be one of {sorted(RECIPES)}, got {task!r}.")
    return RECIPES[task]


def task_of(preset):
    """The task of ``preset``: a preset name, or a preset directory (its card's ``task``)."""
    if not isinstance(preset, (str, os.PathLike)):
        raise ValueError(f"`preset` must be a preset name or a preset directory, got {preset!r}.")
    if preset in PRESETS:
        return PRESETS[preset].task
    if os.path.isdir(str(preset)):
        return preset_card(preset).get("task")
    raise ValueError(f"Unknown preset {preset!r}; known presets: {', '.join(sorted(PRESETS))} (or give a preset "
                     "directory).")


def train_preset(name, out_dir, **options):
    """Train preset ``name`` by its task's recipe (``options``: the overrides ``otzoo train`` offers, see each
    recipe's ``train``); returns the model card."""
    task = task_of(name)
    check_output_path("out_dir", out_dir, directory=True)  # before the data are read and the model built
    return recipe_for(task).train(name, out_dir, **options)


def evaluate_preset(preset, weights=None, limit=None, **options):
    """Recompute the card metrics of ``preset`` (a name or a preset directory): ``{"metrics", "card_metrics",
    "examples"}``. A ``limit`` whose test images cannot give the task's metrics raises
    :class:`training.data.errors.EmptySliceError` naming it, before the model is loaded (the recipe's
    ``check_evaluation_limit``)."""
    recipe = recipe_for(task_of(preset))
    # the spec evaluated: a run's card's recipe for --weights of that run (its eval_episodes, eval_queries, ...)
    recipe.check_evaluation_limit(evaluation_spec(preset, weights)[0], limit)
    return recipe.evaluate(preset, weights=weights, limit=limit, **options)
