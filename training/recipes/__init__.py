"""The recipes that train the zoo's presets, one module per task over shared pieces (:mod:`.common`) and the
registries a recipe's named fields are read from (:mod:`.components`).

:data:`RECIPES` is the one table from a preset's task to its recipe module; ``otzoo train``, ``otzoo evaluate``,
``otzoo fine-tune`` and ``otzoo tune`` all go through it. Each recipe module defines ``training_setup(spec, ...)``
(everything a run trains with, built without training), ``train(name, out_dir, **options)`` and ``evaluate(preset,
weights=None, limit=None)`` (``preset``: a name or a preset directory ``otzoo train`` wrote).
"""
import os

from training.recipes import classification, few_shot, retrieval
from training.recipes.common import read_card
from zoo.registry import PRESETS

RECIPES = {"classification": classification, "retrieval": retrieval, "few_shot": few_shot}


def recipe_for(task):
    """The recipe module of ``task``."""
    if task not in RECIPES:
        raise ValueError(f"`task` must be one of {sorted(RECIPES)}, got {task!r}.")
    return RECIPES[task]


def task_of(preset):
    """The task of ``preset``: a preset name, or a preset directory (its card's ``task``)."""
    if preset in PRESETS:
        return PRESETS[preset].task
    if os.path.isdir(str(preset)):
        return read_card(preset).get("task")
    raise ValueError(f"Unknown preset {preset!r}; known presets: {', '.join(sorted(PRESETS))} (or give a preset "
                     "directory).")


def train_preset(name, out_dir, **options):
    """Train preset ``name`` by its task's recipe (``options``: the overrides ``otzoo train`` offers, see each
    recipe's ``train``); returns the model card."""
    return recipe_for(task_of(name)).train(name, out_dir, **options)


def evaluate_preset(preset, weights=None, limit=None, **options):
    """Recompute the card metrics of ``preset`` (a name or a preset directory): ``{"metrics", "card_metrics",
    "examples"}``."""
    return recipe_for(task_of(preset)).evaluate(preset, weights=weights, limit=limit, **options)
