"""The zoo's user API: ``list_models``, ``model_card``, ``build``, ``load`` and ``save_preset``.

Every preset, built-in or a user's, is a directory in one format (:mod:`zoo.preset_format`): ``config.json`` (the
Keras model config), ``model.weights.h5`` and ``metadata.json`` (the model card). The built-in presets' directories
are package data (``zoo/presets/<name>/``, their ``config.json`` written from :func:`build` by
``scripts/write_preset_configs.py``); ``zoo.load(name)`` resolves the name to that directory and loads it exactly as
``zoo.load(directory)`` loads a copy. Their architectures come from ``zoo.registry`` (``build``).

A built-in name is always the built-in preset, even where the working directory holds a preset directory of that
name (``otzoo fine-tune NAME --out NAME`` leaves one): ``zoo.load(NAME)`` then warns once that it loads the packaged
weights and that ``zoo.load("./NAME")`` loads the directory (``otzoo evaluate`` and ``otzoo export`` refuse the bare
name there as ambiguous).
"""
import os
import urllib.error
import warnings
from typing import Callable, NamedTuple

import keras
import numpy as np

from ot_layers.validation import check_flag
from zoo.backbones import backbone as resolve_backbone
from zoo.models import CLASSIFICATION_HEAD_LAYERS, image_classifier
from zoo.preset_format import (CARD_FILE, CONFIG_FILE, WEIGHTS_FILE, MissingWeightsError, PresetFormatError,
                               WeightsDownloadError, WeightsIntegrityError, card_sha256, check_sha256, is_weights_url,
                               load_preset, load_weights, preset_card, read_card, sha256_of, weights_with_card,
                               write_preset)
from zoo.registry import PRESETS
from zoo.resnet import cifar_resnet
from zoo.spec import TASKS, PresetSpec, published_recipe
from zoo.tasks import FEW_SHOT_HEAD_LAYERS, RETRIEVAL_POOLING_LAYERS, embedding_model, few_shot_model

PRESETS_DIR = os.path.join(os.path.dirname(__file__), "presets")
__all__ = ["list_models", "model_card", "preset_dir", "build", "load", "save_preset", "sha256_of",
           "WeightsIntegrityError", "WeightsDownloadError", "WEIGHTS_FILE", "CARD_FILE", "CONFIG_FILE"]
_ARCHITECTURE_KEYS = ("backbone", "head", "num_classes", "input_shape", "pixel_mean", "pixel_std", "pooling",
                      "embedding_dim", "ways")


class ShadowedPresetWarning(UserWarning):
    """``zoo.load(NAME)`` loads the built-in preset while the working directory holds a preset directory ``./NAME``
    too (a command line that says so its own way filters this category)."""


def _check_name(name, argument="name"):
    """``name`` if it can name a preset (a string) or a preset directory (a path), else a ``ValueError`` naming
    ``argument`` (a list, say, which is no key of the registry)."""
    if not isinstance(name, (str, os.PathLike)):
        raise ValueError(f"`{argument}` must be a preset name or a preset directory, got {name!r}.")
    return name


# The (name, directory) pairs zoo.load has warned about already: each is said once a process.
_SHADOWED_WARNED = set()


def shadowed_directory(name):
    """``./NAME`` when ``name`` is a built-in preset's name and the working directory holds a preset directory of
    that name too (its ``metadata.json``; ``otzoo fine-tune NAME --out NAME`` or ``otzoo train NAME --out NAME``
    leave one), which the bare name does not read; ``None`` otherwise, and for the package directory itself (run
    from ``zoo/presets``)."""
    if not isinstance(name, str) or name not in PRESETS or not os.path.isfile(os.path.join(name, CARD_FILE)):
        return None
    if os.path.realpath(name) == os.path.realpath(preset_dir(name)):
        return None
    return os.path.join(os.curdir, name)


def _warn_shadowed(name):
    """Warn once (per name and directory) that ``zoo.load(name)`` loads the built-in preset, not the preset
    directory of that name here (:func:`shadowed_directory`), and how to load the directory."""
    local = shadowed_directory(name)
    if local is None:
        return
    key = (name, os.path.realpath(local))
    if key in _SHADOWED_WARNED:
        return
    _SHADOWED_WARNED.add(key)
    warnings.warn(f"zoo.load({name!r}) loads the built-in preset {name} with its packaged weights, not the preset "
                  f"directory {local} in the working directory; zoo.load({local!r}) loads the directory.",
                  ShadowedPresetWarning, stacklevel=3)


def _spec(name):
    _check_name(name)
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}.")
    return PRESETS[name]


def list_models(task=None):
    """The preset names, sorted; only those of ``task`` (one of ``TASKS``) when given."""
    if task is not None and task not in TASKS:
        raise ValueError(f"`task` must be one of {list(TASKS)} or None, got {task!r}.")
    return sorted(name for name, spec in PRESETS.items() if task is None or spec.task == task)


def preset_dir(name):
    """The package directory of a built-in preset (it may not hold weights yet)."""
    _spec(name)
    return os.path.join(PRESETS_DIR, name)


def model_card(name):
    """The model card of preset ``name`` as a dict (task, data and split, recipe, metrics, parameters, sha256 of
    the weights, training time and hardware, the reproducing command, date). A preset whose weights have not been
    trained yet has ``metrics=None`` and ``weights_sha256=None``. ``name`` may also be a preset directory, as for
    :func:`load`: its ``metadata.json``; a built-in name is the built-in preset's card even where the working
    directory holds a preset directory of that name (``"./NAME"`` reads that one's)."""
    _check_name(name)
    if name not in PRESETS and os.path.isdir(str(name)):
        return preset_card(name)
    spec = _spec(name)
    card = read_card(preset_dir(name))
    if card is not None:
        return card
    return dict(name=name, task=spec.task, dataset=spec.data.dataset, split=spec.data.split,
                description=spec.description, recipe=published_recipe(spec.recipe), metrics=None, weights_sha256=None,
                command=f"otzoo train {name}")


# The backbones ``build``'s ``l2`` (the recipes' weight decay) applies to: the CIFAR-style ResNets.
L2_BACKBONES = ("resnet20", "resnet32", "resnet56")


def _backbone(backbone, input_shape, l2):
    """The feature extractor ``backbone`` (a name) for ``input_shape``, named ``backbone``; ``l2`` applies to the
    CIFAR-style ResNets."""
    input_shape = tuple(input_shape)
    key = backbone.lower() if isinstance(backbone, str) else backbone  # backbone names are case-insensitive
    if key in L2_BACKBONES:
        return cifar_resnet(int(key[len("resnet"):]), input_shape, l2=l2, name="backbone")
    if l2:
        raise ValueError(f"`l2` applies to the CIFAR-style ResNet backbones only, not to {backbone!r}.")
    return resolve_backbone(backbone, input_shape)


class TaskBuilder(NamedTuple):
    """How :func:`build` assembles the model of one task: ``layer``, the architecture key naming the task's own layer
    (``"head"``, or ``"pooling"`` for retrieval), whose arguments are the ``zoo.spec.Architecture`` field
    ``<layer>_kwargs``; ``layers``, the :class:`zoo.head_layers.HeadLayer` of each name that key takes (``None``: a
    layer without arguments); ``make(backbone, values, layer_kwargs, name)``, the model from the built ``backbone``,
    the architecture ``values`` (overrides applied: ``head``, ``pooling``, ``embedding_dim``, ``ways``,
    ``num_classes``, ``pixel_mean``, ``pixel_std``, ...), the layer's arguments and the model's name; ``keys``, the
    architecture keys the task's model uses (an override of another one would be ignored, so :func:`build` refuses
    it)."""
    layer: str
    layers: dict
    make: Callable
    keys: tuple


def _statistics(values):
    return dict(pixel_mean=values["pixel_mean"], pixel_std=values["pixel_std"])


def _classifier(backbone, values, layer_kwargs, name):
    return image_classifier(backbone, values["head"], values["num_classes"], head_kwargs=layer_kwargs, name=name,
                            **_statistics(values))


def _embedding(backbone, values, layer_kwargs, name):
    return embedding_model(backbone, values["pooling"], values["embedding_dim"], pooling_kwargs=layer_kwargs,
                           name=name, **_statistics(values))


def _few_shot(backbone, values, layer_kwargs, name):
    return few_shot_model(backbone, values["head"], values["ways"], head_kwargs=layer_kwargs, name=name,
                          **_statistics(values))


# The model of each task (a classifier, an embedding model, a few-shot model): a new task is one entry.
_INPUT_KEYS = ("backbone", "input_shape", "pixel_mean", "pixel_std")
TASK_BUILDERS = {
    "classification": TaskBuilder("head", CLASSIFICATION_HEAD_LAYERS, _classifier,
                                  _INPUT_KEYS + ("head", "num_classes")),
    "retrieval": TaskBuilder("pooling", RETRIEVAL_POOLING_LAYERS, _embedding,
                             _INPUT_KEYS + ("pooling", "embedding_dim")),
    "few_shot": TaskBuilder("head", FEW_SHOT_HEAD_LAYERS, _few_shot, _INPUT_KEYS + ("head", "ways")),
}


def _check_layer_overrides(spec, builder, kind, layer_overrides):
    """Each of ``layer_overrides`` (``build``'s overrides that are not architecture keys) must be an argument of the
    layer of ``builder.layer`` ``kind``; the first that is not is named with the keys and arguments there are."""
    layer = builder.layers[kind]
    loading_keys = [key for key in layer_overrides if key in ("pretrained", "weights")]
    if loading_keys:
        raise ValueError(f"`{loading_keys[0]}` is an argument of zoo.load, not of zoo.build (which builds an "
                         "untrained architecture).")
    if layer is None:
        refused = (next(iter(layer_overrides)), f"the {kind!r} {builder.layer} takes no arguments")
    else:
        refused = layer.first_refusal(layer_overrides)
    if refused is not None:
        key, reason = refused
        raise ValueError(f"`{key}` is not an architecture key of the {spec.task} preset {spec.name!r} "
                         f"({', '.join(builder.keys)}), and {reason}.")


def _architecture_values(spec):
    """The architecture keys' values of preset ``spec`` (a :class:`zoo.spec.PresetSpec`)."""
    arch, data = spec.architecture, spec.data
    return dict(backbone=arch.backbone, head=arch.head, pooling=arch.pooling, embedding_dim=arch.embedding_dim,
                ways=arch.ways, num_classes=data.num_classes, input_shape=data.input_shape,
                pixel_mean=data.pixel_mean, pixel_std=data.pixel_std)


def _same_value(given, own):
    if isinstance(given, np.ndarray):  # input_shape=np.array([28, 28, 1]): its values, as build takes them
        given = given.tolist()
    if isinstance(given, (list, tuple)) and isinstance(own, (list, tuple)):
        return tuple(given) == tuple(own)
    try:
        return bool(given == own)
    except (TypeError, ValueError):  # e.g. an array of several values
        return False


def _changes(spec, overrides):
    """The overrides of preset ``spec`` that change its architecture or its layer's arguments: those whose value is
    the preset's own (``num_classes=10`` of a 10-class preset, ``backbone="ResNet20"``, ``input_shape`` as an array
    of the preset's values) are left out, and so is ``l2``, a training penalty that changes neither the layers nor
    what the model computes."""
    own = _architecture_values(spec)  # the registry's backbone names are lower case
    for field in ("head_kwargs", "pooling_kwargs"):
        own.update(getattr(spec.architecture, field))
    changed = {}
    for key, value in overrides.items():
        if key == "l2":
            continue
        given = value.lower() if key == "backbone" and isinstance(value, str) else value
        if key not in own or not _same_value(given, own[key]):
            changed[key] = value
    return changed


def build(name, l2=0.0, **overrides):
    """The untrained architecture of preset ``name`` (a classifier, an embedding model or a few-shot model, by the
    preset's task; see :mod:`zoo.models` and :mod:`zoo.tasks`).

    ``name``: a preset name or a :class:`zoo.spec.PresetSpec` (e.g. a preset re-targeted at another data set with
    ``spec.with_data``). ``overrides`` change the architecture (``num_classes``, ``input_shape``, ``head``,
    ``backbone``, ``pooling``, ``embedding_dim``, ``ways``, ``pixel_mean``, ``pixel_std``) or, for any other key, the
    head layer's arguments (the pooling layer's for retrieval presets; e.g. ``epsilon=0.05``); an architecture key
    the preset's task does not use (a classifier's ``ways``, a few-shot model's ``num_classes``), or a key the head's
    layer does not take, is refused, not ignored. An override of ``head`` (``pooling``) by another one drops the
    preset's own head arguments: the new head starts from its defaults and the other overrides. ``backbone`` may be
    any name in ``zoo.BACKBONES``. ``l2``: an L2 penalty on the ResNet backbone's convolution kernels (the recipes'
    weight decay).
    """
    spec = name if isinstance(name, PresetSpec) else _spec(name)
    arch = spec.architecture
    if spec.task not in TASK_BUILDERS:
        raise ValueError(f"`task` of preset {spec.name!r} must be one of {list(TASK_BUILDERS)}, got {spec.task!r}.")
    builder = TASK_BUILDERS[spec.task]
    values = _architecture_values(spec)
    layer_overrides = {}
    for key, value in overrides.items():
        if key in _ARCHITECTURE_KEYS:
            if key not in builder.keys:
                raise ValueError(f"`{key}` does not apply to the {spec.task} preset {spec.name!r}, whose model "
                                 f"takes {', '.join(builder.keys)} (and its layer's arguments).")
            values[key] = value
        else:
            layer_overrides[key] = value
    kind = values[builder.layer]
    # The preset's own layer arguments belong to its own head (pooling): another one starts from its defaults.
    layer_kwargs = dict(getattr(arch, f"{builder.layer}_kwargs")) if kind == getattr(arch, builder.layer) else {}
    if layer_overrides and isinstance(kind, str) and kind in builder.layers:
        _check_layer_overrides(spec, builder, kind, layer_overrides)
    layer_kwargs.update(layer_overrides)
    backbone = _backbone(values["backbone"], values["input_shape"], l2)
    return builder.make(backbone, values, layer_kwargs, spec.name)


def _url_weights(name, url, expected_sha256):
    """The local copy of weights at ``url`` (fetched once into ``$KERAS_HOME``), checked against the card."""
    if not expected_sha256:
        raise ValueError(f"`weights`: a URL needs the preset's sha256 in its card to check the download; "
                         f"preset {name!r} has none.")
    fname = f"{name}-{expected_sha256[:12]}.weights.h5"
    try:
        path = keras.utils.get_file(fname, origin=url, cache_subdir=os.path.join("otzoo", name))
    except Exception as error:  # Keras raises a bare Exception for a failed fetch, the URLError as its context;
        # an error while reading (a timeout, a reset connection) comes as it is
        cause = error if isinstance(error, OSError) else error.__context__
        if not isinstance(cause, OSError):
            raise
        status = f"HTTP {cause.code} " if isinstance(cause, urllib.error.HTTPError) else ""
        reason = getattr(cause, "reason", None) or cause
        raise WeightsDownloadError(f"`weights`: could not fetch {url} ({status}{reason}); check the address, "
                                   "or download the file and give its path.") from error
    try:
        check_sha256(path, expected_sha256)
    except WeightsIntegrityError:
        os.remove(path)  # fetched again next time
        raise
    return path


def _package_weights(name):
    path = os.path.join(preset_dir(name), WEIGHTS_FILE)
    if not os.path.isfile(path):
        raise MissingWeightsError(f"preset {name!r} has no pretrained weights in this installation ({path}); "
                                  f"train them with `otzoo train {name}`, or give a weights file or URL (zoo.load's "
                                  f"`weights=`, the command line's --weights).")
    return path


def load(name, pretrained=True, weights=None, **overrides):
    """A preset's model: ``name`` is a built-in preset's name or a preset directory (see the module docstring).

    ``zoo.load(name)`` loads the built-in preset's package directory as ``zoo.load(directory)`` loads any preset
    directory: its ``config.json``, its ``model.weights.h5`` checked against the card's sha256 before loading (no
    network needed). The model states its task (``ot_layers.TaskModel``), the card's ``task``.

    For a built-in ``name`` only: ``pretrained=False`` gives :func:`build`'s untrained model; ``overrides`` go to
    :func:`build` (the weights then load only if the shapes still match, with a warning, for an override that
    changes the preset, that the card describes the model without it and that the weights of layers it removes are
    not used, unless the card of the weights records the override among its ``head_overrides``, as a run of a tuned
    configuration's does); ``weights``: a ``.weights.h5`` file, a preset directory (its ``model.weights.h5``) or an http(s) URL
    (fetched with ``keras.utils.get_file`` into ``$KERAS_HOME``; one that cannot be fetched raises
    :class:`WeightsDownloadError`, a ``ConnectionError``) instead of the packaged weights; ``weights`` with
    ``pretrained=False`` is refused. Weights are checked before they load against the card that accompanies them:
    the directory's ``metadata.json``, the one beside a ``model.weights.h5`` file, the preset's card for a URL or the
    packaged weights; a mismatch raises :class:`WeightsIntegrityError` (a ``ValueError``)
    naming the file and both hashes. A weights file no card accompanies loads with a warning that it is unchecked.

    A built-in ``name`` is the built-in preset even where the working directory holds a preset directory of that
    name (what ``otzoo fine-tune NAME --out NAME`` leaves): loading its packaged weights there warns once that
    ``zoo.load("./NAME")`` loads the directory (not with ``weights=`` or ``pretrained=False``, which say what loads).
    """
    pretrained = check_flag("pretrained", pretrained)
    _check_name(name)
    if name not in PRESETS:
        if os.path.isdir(str(name)):
            if not pretrained or weights is not None or overrides:
                raise ValueError("`pretrained`, `weights` and overrides apply to built-in preset names; a preset "
                                 f"directory ({name!r}) loads as it is: zoo.load(directory).")
            return load_preset(str(name))
        raise ValueError(f"Unknown preset {name!r}, and no preset directory of that name; known presets: "
                         f"{', '.join(sorted(PRESETS))}.")
    if not pretrained:
        if weights is not None:
            raise ValueError("`weights` load pretrained weights, which `pretrained=False` declines; drop one of them.")
        return build(name, **overrides)
    if weights is None:  # the packaged weights: a preset directory of that name here is not what loads
        _warn_shadowed(name)
    if weights is None and not overrides:
        _package_weights(name)
        return load_preset(preset_dir(name))
    model = build(name, **overrides)
    if weights is None:
        path, card = _package_weights(name), model_card(name)
    elif is_weights_url(weights):
        card = model_card(name)
        path = _url_weights(name, str(weights), card_sha256(card, f"the card of preset {name!r}"))
    else:
        path, card = weights_with_card(weights)
    changed = _changes(PRESETS[name], overrides)
    recorded = (card or {}).get("head_overrides")
    if not changed or (isinstance(recorded, dict) and all(recorded.get(k) == v for k, v in changed.items())):
        # the card of the weights records these overrides (a run of `otzoo train --config` of a tuned head): the
        # weights were trained with them, and nothing of the warning below would be true
        return load_weights(model, path, card)
    changes = ", ".join(f"{key}={value!r}" for key, value in changed.items())
    try:
        model = load_weights(model, path, card)
    except PresetFormatError as error:
        raise PresetFormatError(f"{error} (the overrides {changes} change the preset's architecture, which the "
                                "weights may no longer fit; load with pretrained=False to train it anew)") from error
    warnings.warn(f"zoo.load({name!r}, {changes}): the weights were trained, and the card's metrics measured, "
                  "without these overrides; weights of layers they remove are left unused.", UserWarning,
                  stacklevel=2)
    return model


def save_preset(model, directory, card=None, overwrite=False):
    """Write ``model`` as a preset directory (``config.json``, ``model.weights.h5``, ``metadata.json``) that
    :func:`load` reads back (:func:`zoo.preset_format.write_preset`). ``model``: a functional or ``Sequential``
    model with a known input whose config Keras rebuilds in safe mode (a subclassed model, an unbuilt
    ``Sequential`` or a ``Lambda`` layer of Python code is refused before anything is written). ``card``: the model
    card's fields; its ``task`` is required unless ``model`` states one (``ot_layers.TaskModel``, as the zoo's
    builders give); the weights' sha256 and the parameter count are added.

    A ``directory`` that holds a preset already (its ``metadata.json`` or ``config.json``; a packaged preset too) is
    refused unless ``overwrite=True``, which replaces the preset's three files (other files there stay). The files
    are written under temporary names and renamed into place, the card last: a write that fails leaves the earlier
    preset intact (but for a failure between the renames, which ``zoo.load`` then refuses by the card's sha256)."""
    return write_preset(model, directory, card, overwrite=overwrite)
