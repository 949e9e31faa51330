"""The registries a recipe's named fields are read from: optimizers, learning-rate schedules, losses, layer-state
callbacks, and the few-shot meta optimizer (the augmentations are the data pipelines': ``training.data``).

A recipe (``zoo.spec.Recipe`` / ``FewShotRecipe``) names each part; :func:`check_recipe` rejects an unknown name
with one ``ValueError`` naming the field and the accepted values before anything is built or read, and a recipe
that sets a field its optimizer does not use (e.g. ``momentum`` with ``adam``), which would otherwise be silently
ignored; :func:`check_pad` likewise a ``pad`` its augmentation does not use (``augment="none"``).
"""
import dataclasses
import math
import numbers

import keras
import numpy as np

from ot_layers.callbacks import GSPPrototypeInit, PrototypeReassignment
from ot_layers.losses import HypersphericalPullLoss, ProxyAnchorLoss, ProxyNCAPlusPlusLoss
from ot_layers.validation import MAX_SEED
from zoo.models import hyperspherical_training_model
from zoo.spec import FewShotRecipe
from zoo.tasks import proxy_training_model


def choose(table, field, name, what="recipe field"):
    """``table[name]``, or a ``ValueError`` naming ``field`` and the accepted names."""
    if name not in table:
        raise ValueError(f"{what} `{field}` must be one of {sorted(table)}, got {name!r}.")
    return table[name]


# Optimizers: ``(learning rate or schedule, momentum, nesterov) -> keras optimizer``; momentum and Nesterov apply to
# SGD only (Adam's and AdamW's moments are their own, Kingma & Ba 2015, Loshchilov & Hutter 2019).
OPTIMIZERS = {
    "sgd": lambda rate, momentum, nesterov: keras.optimizers.SGD(rate, momentum=momentum, nesterov=nesterov),
    "adam": lambda rate, momentum, nesterov: keras.optimizers.Adam(rate),
    "adamw": lambda rate, momentum, nesterov: keras.optimizers.AdamW(rate),
}
# The arguments each optimizer of :data:`OPTIMIZERS` uses: a recipe changing another one from its default is refused.
OPTIMIZER_ARGUMENTS = {"sgd": ("momentum", "nesterov"), "adam": (), "adamw": ()}


def _step_decay(rate, steps):
    """x0.1 at 50 % and again at 75 % of the run (the CIFAR ResNet schedule of He et al. 2016)."""
    boundaries = [max(1, steps // 2), max(2, (3 * steps) // 4)]
    return keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, [rate, rate * 0.1, rate * 0.01])


# Schedules: ``(learning rate, total steps) -> learning rate or keras schedule``.
SCHEDULES = {
    "cosine": lambda rate, steps: keras.optimizers.schedules.CosineDecay(rate, decay_steps=max(1, steps)),
    "constant": lambda rate, steps: rate,
    "step": _step_decay,
}


def make_optimizer(recipe, steps):
    """The recipe's ``optimizer`` (``momentum``, ``nesterov``) at ``learning_rate`` under ``schedule`` over
    ``steps`` optimizer steps (the whole run)."""
    schedule = choose(SCHEDULES, "schedule", recipe.schedule)(recipe.learning_rate, steps)
    return choose(OPTIMIZERS, "optimizer", recipe.optimizer)(schedule, recipe.momentum, recipe.nesterov)


def compiled_step(jit_compile):
    """``model.compile``'s ``jit_compile`` for a requested one (a recipe's): XLA on TensorFlow and JAX as
    requested; eager on PyTorch, where Keras would hand the step to ``torch.compile``, which retraces the solvers'
    loops for every new iteration count and batch shape (minutes per step on a CPU)."""
    return bool(jit_compile) and keras.backend.backend() != "torch"


def make_meta_optimizer(recipe):
    """The few-shot recipe's ``meta_optimizer`` at the constant ``meta_learning_rate`` (``meta_momentum`` for SGD,
    without Nesterov)."""
    return choose(OPTIMIZERS, "meta_optimizer", recipe.meta_optimizer)(recipe.meta_learning_rate,
                                                                        recipe.meta_momentum, False)


class _Loss:
    """One loss of the registry: the task it trains, the keyword arguments it accepts, and
    ``make(model, num_classes, **kwargs) -> (the model fit trains, the loss, how to feed it (x, y) batches)``."""

    def __init__(self, task, accepted, make):
        self.task, self.accepted, self.make = task, accepted, make


def _same(x, y):
    return x, y


def _images_and_labels(x, y):
    return (x, y), y


def _proxy_model(model, num_classes, num_proxies):
    return proxy_training_model(model, num_classes, num_proxies)


LOSSES = {
    "cross_entropy": _Loss("classification", (), lambda model, num_classes: (
        model, keras.losses.SparseCategoricalCrossentropy(from_logits=True), _same)),
    # DL2PA (Saadabadi et al. 2024): the labels reach the head as a second input (its class representatives).
    "hyperspherical_pull": _Loss("classification", (), lambda model, num_classes: (
        hyperspherical_training_model(model), HypersphericalPullLoss(), _images_and_labels)),
    # Teh et al. 2020 (ProxyNCA++) and Kim et al. 2020 (Proxy-Anchor) on ``ClassProxies`` of the seen classes.
    "proxy_nca_plus_plus": _Loss("retrieval", ("temperature", "num_proxies"), lambda model, num_classes,
                                 temperature=0.1, num_proxies=1: (
        _proxy_model(model, num_classes, num_proxies), ProxyNCAPlusPlusLoss(temperature=temperature), _same)),
    "proxy_anchor": _Loss("retrieval", ("margin", "alpha", "num_proxies"), lambda model, num_classes, margin=0.1,
                          alpha=32.0, num_proxies=1: (
        _proxy_model(model, num_classes, num_proxies), ProxyAnchorLoss(margin=margin, alpha=alpha), _same)),
}


class RecipeError(ValueError):
    """A recipe whose loss, loss arguments or layer-state callbacks do not fit the preset's model (a
    ``hyperspherical_pull`` loss on a model without prototypes, a ``loss_kwargs`` value the loss refuses, a callback
    driving a layer the model lacks), or a pre-training field other than the backbone's own in a few-shot run given a
    pre-trained backbone (``training.recipes.few_shot.check_pretraining_fields``): the user's recipe, found while a
    run is set up, before it trains or writes."""


def make_loss(recipe, task, model, num_classes):
    """``(the model fit trains, the loss, the batch feed)`` of the recipe's ``loss`` with its ``loss_kwargs`` for
    ``model`` (the served model) and ``num_classes`` training classes; a :class:`RecipeError` where they do not fit
    the model or a value is refused."""
    entry = _loss_entry(recipe, task)
    try:
        return entry.make(model, num_classes, **dict(recipe.loss_kwargs))
    except ValueError as error:
        raise RecipeError(f"recipe field `loss` {recipe.loss!r} with `loss_kwargs` {dict(recipe.loss_kwargs)} does "
                          f"not fit model {model.name!r}: {str(error).splitlines()[0]}") from error


def _loss_entry(recipe, task):
    entry = choose({k: v for k, v in LOSSES.items() if v.task == task}, "loss", recipe.loss,
                   what=f"recipe field (for a {task} preset)")
    unknown = sorted(set(recipe.loss_kwargs) - set(entry.accepted))
    if unknown:
        raise ValueError(f"recipe field `loss_kwargs` of loss {recipe.loss!r} accepts {list(entry.accepted)}, got "
                         f"{unknown}.")
    return entry


# Layer-state callbacks by name: ``(the served model, sample images (float32), seed) -> callback``; each drives
# the layer the preset's builder names.
def _prototype_reassignment(model, images, seed):
    _require_layer(model, "hyperspherical_head", "PrototypeReassignment")
    return PrototypeReassignment(layer_name="hyperspherical_head")


def _gsp_prototype_init(model, images, seed):
    _require_layer(model, "gsp", "GSPPrototypeInit")
    return gsp_prototype_init(images, seed)


def gsp_prototype_init(images, seed):
    """GSP's GAP warm-up epoch and k-center prototype initialization (Gurbuz et al. 2023) from the first 256 of
    ``images`` (raw pixels): the one way every GSP run (recipes, tuning) initializes the ``gsp`` layer."""
    return GSPPrototypeInit(images[:256].astype("float32"), layer_name="gsp", seed=seed)


def _require_layer(model, layer_name, callback):
    if layer_name not in {layer.name for layer in model.layers}:
        raise RecipeError(f"recipe field `callbacks`: {callback} drives the layer {layer_name!r}, which model "
                          f"{model.name!r} does not have.")


CALLBACKS = {"PrototypeReassignment": _prototype_reassignment, "GSPPrototypeInit": _gsp_prototype_init}


def make_callbacks(recipe, model, images):
    """The recipe's ``callbacks`` for ``model`` (the served model) in the recipe's order; ``images``: a sample of
    the training images (raw pixels) for the callbacks that initialize from data."""
    return [choose(CALLBACKS, "callbacks", name)(model, images, recipe.seed) for name in recipe.callbacks]


def _check_optimizer_fields(recipe, optimizer_field, fields):
    """Refuse a recipe whose optimizer (the recipe field ``optimizer_field``) does not use one of ``fields``
    (``{recipe field: the optimizer argument it sets}``) while that field differs from the recipe class's
    default: the value would be silently ignored."""
    optimizer = getattr(recipe, optimizer_field)
    used = OPTIMIZER_ARGUMENTS[optimizer]
    defaults = {f.name: f.default for f in dataclasses.fields(recipe)}
    for field, argument in fields.items():
        value = getattr(recipe, field)
        if argument not in used and value != defaults[field]:
            users = sorted(name for name, arguments in OPTIMIZER_ARGUMENTS.items() if argument in arguments)
            raise ValueError(f"recipe field `{field}` ({value!r}) applies to `{optimizer_field}` {users} only; "
                             f"{optimizer!r} does not use it: leave it at its default {defaults[field]!r}.")


# The augmentations that read a recipe's ``pad`` (the pixels added on each side before the random crop).
PADDED_AUGMENTATIONS = ("pad_crop_flip",)


def check_pad(recipe):
    """Refuse a ``pad`` changed from the recipe class's default while ``augment`` (a name the data set's loader
    has, checked first) pads nothing (``none``, ``resize_crop_flip``): the value would be silently ignored, yet
    published in the card."""
    default = next(f.default for f in dataclasses.fields(recipe) if f.name == "pad")
    if recipe.augment not in PADDED_AUGMENTATIONS and recipe.pad != default:
        raise ValueError(f"recipe field `pad` ({recipe.pad!r}) applies to `augment` {list(PADDED_AUGMENTATIONS)} "
                         f"only; {recipe.augment!r} pads nothing: leave it at its default {default!r}.")


def _integer(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


# What each numeric, flag or container field of a recipe must hold (a field a recipe class lacks is skipped):
# ``(what it must be, test, fields)``. A count of 0, a negative or NaN rate would otherwise fail deep in training
# or, worse, train (a negative learning rate ascends the loss) and publish the value in the card.
VALUE_RULES = (
    ("an integer >= 1", lambda v: _integer(v) and v >= 1,
     ("batch_size", "epochs", "pretrain_epochs", "meta_episodes", "shots", "queries", "eval_episodes",
      "eval_queries")),
    ("an integer >= 2", lambda v: _integer(v) and v >= 2, ("ways",)),
    ("an integer in 0 .. 2**32 - 1", lambda v: _integer(v) and 0 <= v <= MAX_SEED, ("seed", "eval_seed")),
    ("an integer >= 0", lambda v: _integer(v) and v >= 0, ("pad",)),
    ("a name (a JSON string)", lambda v: isinstance(v, str),
     ("optimizer", "schedule", "augment", "loss", "meta_optimizer")),
    ("a finite number > 0", lambda v: _real(v) and v > 0, ("learning_rate", "meta_learning_rate")),
    ("a finite number >= 0", lambda v: _real(v) and v >= 0, ("l2",)),
    ("a number in [0, 1)", lambda v: _real(v) and 0 <= v < 1, ("momentum", "meta_momentum")),
    ("true or false", lambda v: isinstance(v, bool), ("nesterov", "jit_compile")),
    ("an object of keyword arguments (JSON {...})", lambda v: isinstance(v, dict), ("loss_kwargs",)),
    ("a list of names (JSON [...])", lambda v: isinstance(v, (list, tuple)) and all(isinstance(n, str) for n in v),
     ("callbacks",)),
    ("a non-empty list of integers >= 1 (JSON [...])",
     lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(_integer(n) and n >= 1 for n in v),
     ("eval_shots",)),
)


def plain_value(value):
    """``value`` with every NumPy scalar in it (``np.int64(1)``, ``np.float32(0.05)``, also inside a list, tuple or
    dict) made the Python number, flag or string it holds (``.item()``): a run's ``run.json`` and its card are JSON,
    which has no NumPy types."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(plain_value(item) for item in value)
    if isinstance(value, dict):
        return {plain_value(key): plain_value(item) for key, item in value.items()}
    return value


def check_recipe_values(recipe):
    """Raise one ``ValueError`` naming the first field of ``recipe`` whose value is not what :data:`VALUE_RULES`
    asks (a count below 1, a learning rate <= 0 or NaN, a momentum outside [0, 1), a string for a list, ...).
    Returns the recipe with its NumPy scalars made Python values (:func:`plain_value`)."""
    recipe = dataclasses.replace(recipe, **{f.name: plain_value(getattr(recipe, f.name))
                                            for f in dataclasses.fields(recipe)})
    present = {f.name for f in dataclasses.fields(recipe)}
    for what, test, fields in VALUE_RULES:
        for field in fields:
            if field in present and not test(getattr(recipe, field)):
                raise ValueError(f"recipe field `{field}` must be {what}, got {getattr(recipe, field)!r}.")
    return recipe


def check_recipe(recipe, task):
    """Raise one ``ValueError`` naming the field for the first value out of its range (:func:`check_recipe_values`)
    or unknown name in ``recipe`` (a ``task`` preset's), for a field its optimizer does not use changed from its
    default (``momentum``, ``nesterov`` with ``adam`` or ``adamw``; ``meta_momentum`` with a few-shot recipe's
    ``meta_optimizer`` ``adam`` or ``adamw``). Returns the recipe with its NumPy scalars made Python values
    (``np.int64(1)`` -> ``1``: JSON, which ``run.json`` and the card are, has no NumPy types)."""
    recipe = check_recipe_values(recipe)
    choose(OPTIMIZERS, "optimizer", recipe.optimizer)
    choose(SCHEDULES, "schedule", recipe.schedule)
    _check_optimizer_fields(recipe, "optimizer", {"momentum": "momentum", "nesterov": "nesterov"})
    if isinstance(recipe, FewShotRecipe):
        choose(OPTIMIZERS, "meta_optimizer", recipe.meta_optimizer)
        _check_optimizer_fields(recipe, "meta_optimizer", {"meta_momentum": "momentum"})
        return recipe
    _loss_entry(recipe, task)
    for name in recipe.callbacks:
        choose(CALLBACKS, "callbacks", name)
    return recipe
