"""The recipes that train the zoo's presets, one module per task over shared pieces (:mod:`.common`).

:data:`RECIPES` is the one table from a preset's task to its recipe module; ``otzoo train``, ``otzoo evaluate``,
``otzoo fine-tune`` and ``otzoo tune`` all go through it. Each recipe module defines ``train(name, out_dir,
**options)`` and ``evaluate(name, weights=None, limit=None)``.
"""
from training.recipes import classification, few_shot, retrieval
from zoo.registry import PRESETS

RECIPES = {"classification": classification, "retrieval": retrieval, "few_shot": few_shot}


def recipe_for(task):
    """The recipe module of ``task``."""
    if task not in RECIPES:
        raise ValueError(f"`task` must be one of {sorted(RECIPES)}, got {task!r}.")
    return RECIPES[task]


def train_preset(name, out_dir, **options):
    """Train preset ``name`` by its task's recipe (``options``: the overrides ``otzoo train`` offers, see each
    recipe's ``train``); returns the model card."""
    return recipe_for(PRESETS[name]["task"]).train(name, out_dir, **options)


def evaluate_preset(name, weights=None, limit=None):
    """Recompute preset ``name``'s card metrics: ``{"metrics", "card_metrics", "examples"}``."""
    return recipe_for(PRESETS[name]["task"]).evaluate(name, weights=weights, limit=limit)
