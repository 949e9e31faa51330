"""The typed description of a preset, in the manner of timm's ``PretrainedCfg``: what the model is
(:class:`Architecture`), what it is trained and evaluated on (:class:`DataSpec`), how it is trained (:class:`Recipe`
or :class:`FewShotRecipe`) and what its card says (``description``).

Every class is a frozen dataclass: a preset is data. ``dataclasses.asdict(spec.recipe)`` is the recipe a model card
publishes, and every field of it is read by the code that trains (``training.recipes``); its names (``optimizer``,
``schedule``, ``augment``, ``loss``, ``callbacks``, ``meta_optimizer``) are looked up in the training registries
(``training.recipes.components``), which reject unknown names with a ``ValueError`` naming the field.
"""
import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Optional, Tuple, Union

from zoo.preset_format import PresetFormatError

@dataclass(frozen=True)
class Architecture:
    """The network: a backbone (``zoo.BACKBONES`` or a CIFAR-style ResNet), and by task a classification or few-shot
    ``head`` with its ``head_kwargs``, or a retrieval ``pooling`` with its ``pooling_kwargs`` and the embedding's
    ``embedding_dim``; ``ways``: the few-shot model's classes per episode."""
    backbone: str
    head: Optional[str] = None
    head_kwargs: dict = field(default_factory=dict)
    pooling: Optional[str] = None
    pooling_kwargs: dict = field(default_factory=dict)
    embedding_dim: Optional[int] = None
    ways: Optional[int] = None


@dataclass(frozen=True)
class DataSpec:
    """The data set a preset is trained and evaluated on: its name (``fashion_mnist`` or a TFDS name), the model's
    ``input_shape``, the number of classes, the pixel statistics (in [0, 1] units) the model normalizes with, a
    human description of the ``split``, and for the class-split protocols (retrieval, few-shot) the classes trained
    on (``train_classes``) and evaluated on (``eval_classes``)."""
    dataset: str
    input_shape: Tuple[int, ...]
    num_classes: int
    pixel_mean: float
    pixel_std: float
    split: str
    train_classes: Optional[Tuple[int, ...]] = None
    eval_classes: Optional[Tuple[int, ...]] = None


@dataclass(frozen=True)
class Optimization:
    """The fields every recipe shares: ``batch_size``; ``optimizer`` (``sgd`` with ``momentum`` and ``nesterov``,
    ``adam``, ``adamw``) at ``learning_rate`` under ``schedule`` (``cosine``: decay to 0 over the run;
    ``constant``; ``step``: x0.1 at 50 % and 75 % of the run); an L2 penalty ``l2`` on the backbone's kernels; the
    training augmentation ``augment`` (``pad_crop_flip`` with ``pad`` pixels, ``resize_crop_flip`` for the
    fine-grained TFDS sets, or ``none``); the ``seed`` of initialization and data order; whether the step is
    XLA-compiled (``jit_compile``)."""
    batch_size: int = 128
    optimizer: str = "sgd"
    learning_rate: float = 0.1
    momentum: float = 0.9
    nesterov: bool = True
    schedule: str = "cosine"
    l2: float = 5e-4
    augment: str = "pad_crop_flip"
    pad: int = 2
    seed: int = 0
    jit_compile: bool = True


@dataclass(frozen=True)
class Recipe(Optimization):
    """How a classification or retrieval preset is trained: the :class:`Optimization` fields for ``epochs``, the
    ``loss`` with its ``loss_kwargs`` (``cross_entropy``; ``hyperspherical_pull``; the proxy losses
    ``proxy_nca_plus_plus`` (``temperature``, ``num_proxies``) and ``proxy_anchor`` (``margin``, ``alpha``,
    ``num_proxies``)) and the layer-state ``callbacks`` by name.
    """
    epochs: int = 10
    loss: str = "cross_entropy"
    loss_kwargs: dict = field(default_factory=dict)
    callbacks: Tuple[str, ...] = ()


@dataclass(frozen=True)
class FewShotRecipe(Optimization):
    """How a few-shot preset is trained (the two stages of DeepEMD, Zhang et al. 2022).

    Pre-training of the backbone + GAP + Dense on the base classes by cross-entropy: ``pretrain_epochs`` with the
    :class:`Optimization` fields. Meta-training: ``meta_episodes`` ``ways``-way ``shots``-shot episodes with
    ``queries`` queries per class, by ``meta_optimizer`` (``sgd`` with ``meta_momentum``, ``adam``, ``adamw``) at
    the constant ``meta_learning_rate``. Evaluation: ``eval_episodes`` episodes per number of shots in
    ``eval_shots`` with ``eval_queries`` queries per class, episode seed ``eval_seed``.
    """
    pretrain_epochs: int = 4
    meta_episodes: int = 400
    meta_optimizer: str = "sgd"
    meta_learning_rate: float = 0.005
    meta_momentum: float = 0.9
    ways: int = 5
    shots: int = 1
    queries: int = 15
    eval_shots: Tuple[int, ...] = (1, 5)
    eval_episodes: int = 1000
    eval_queries: int = 15
    eval_seed: int = 0


AnyRecipe = Union[Recipe, FewShotRecipe]

# The recipe class of each task (the task of a preset is one of these keys).
RECIPE_CLASSES = {"classification": Recipe, "retrieval": Recipe, "few_shot": FewShotRecipe}
TASKS = tuple(RECIPE_CLASSES)


@dataclass(frozen=True)
class PresetSpec:
    """One preset: ``name``, ``task`` (one of :data:`TASKS`), ``architecture``, ``data``, ``recipe`` and the card's
    ``description``."""
    name: str
    task: str
    architecture: Architecture
    data: DataSpec
    recipe: AnyRecipe
    description: str = ""

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"`task` of preset {self.name!r} must be one of {list(TASKS)}, got {self.task!r}.")
        expected = RECIPE_CLASSES[self.task]
        if not isinstance(self.recipe, expected):
            raise ValueError(f"`recipe` of {self.task} preset {self.name!r} must be a {expected.__name__}, got "
                             f"{type(self.recipe).__name__}.")

    def with_recipe(self, **overrides):
        """This spec with the non-``None`` recipe ``overrides`` applied (unknown fields: ``ValueError``)."""
        return dataclasses.replace(self, recipe=replace_fields(self.recipe, overrides))

    def with_data(self, data):
        """This spec trained on another data set (a :class:`DataSpec`)."""
        return dataclasses.replace(self, data=data)


def replace_fields(instance, overrides, what="recipe"):
    """``dataclasses.replace(instance, **overrides)`` for the non-``None`` overrides; an unknown field raises
    ``ValueError`` naming it and the accepted fields."""
    overrides = {key: value for key, value in overrides.items() if value is not None}
    names = [f.name for f in dataclasses.fields(instance)]
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise ValueError(f"{what} field(s) {unknown} unknown; a {type(instance).__name__} has {names}.")
    return dataclasses.replace(instance, **overrides)


def recipe_from_dict(task, values):
    """The recipe of a ``task`` preset from a card's ``recipe`` dict (``dataclasses.asdict`` of one, as JSON reads
    it back: tuples as lists; fields the recipe class does not have, such as a few-shot card's ``pretrained_from``,
    are left out). ``values`` that are not a dict, or a field whose value is not of the field's type (an integer
    where it is ``int``, a number for ``float``, ``true``/``false`` for ``bool``, a string for ``str``, an object for
    ``dict``, a list of the items' type for a tuple), raise one :class:`zoo.preset_format.PresetFormatError` (a
    ``ValueError``) naming the field (``recipe.<field>``): a card is the user's input."""
    cls = RECIPE_CLASSES[task]
    if not isinstance(values, dict):
        raise PresetFormatError(f"`recipe` must be an object of recipe fields, got {values!r}.")
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    kept = {}
    for key, value in values.items():
        if key not in fields:
            continue
        kind = fields[key]
        if not _is_of_type(value, kind):
            raise PresetFormatError(f"`recipe.{key}` must be {_type_words(kind)}, got {value!r}.")
        kept[key] = tuple(value) if typing.get_origin(kind) is tuple else value
    return cls(**kept)


def _is_of_type(value, kind):
    """Whether the JSON value ``value`` is of the recipe field type ``kind`` (``int``, ``float``, ``bool``, ``str``,
    ``dict``, ``Tuple[X, ...]``); ``True`` is no integer, an integer is a number."""
    if typing.get_origin(kind) is tuple:
        return isinstance(value, (list, tuple)) and all(_is_of_type(item, typing.get_args(kind)[0])
                                                        for item in value)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind) if isinstance(kind, type) else True  # a type of another form: not checked here


def _type_words(kind):
    if typing.get_origin(kind) is tuple:
        return f"a list of {_type_words(typing.get_args(kind)[0]).split(' ', 1)[1]}s"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            dict: "an object (a dict)"}.get(kind, f"a {getattr(kind, '__name__', kind)}")


def published_recipe(recipe):
    """The recipe as a card publishes it: ``dataclasses.asdict`` with tuples as lists (what JSON reads back), the
    number of epochs first."""
    values = dataclasses.asdict(recipe)
    first = [key for key in ("epochs", "pretrain_epochs") if key in values]
    return {key: list(values[key]) if isinstance(values[key], tuple) else values[key]
            for key in first + [key for key in values if key not in first]}
