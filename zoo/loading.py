"""The zoo's user API: ``list_models``, ``model_card``, ``build``, ``load`` and ``save_preset``.

A preset is a directory in keras-hub's layout: ``model.weights.h5`` (the weights), ``metadata.json`` (the model
card) and, for a user's own saved model, ``config.json`` (the Keras model config). The built-in presets' directories
are package data (``zoo/presets/<name>/``); their architectures come from ``zoo.registry``.
"""
import hashlib
import json
import os

import keras

from zoo.backbones import backbone as resolve_backbone
from zoo.models import image_classifier
from zoo.registry import PRESETS
from zoo.resnet import cifar_resnet
from zoo.tasks import embedding_model, few_shot_model

PRESETS_DIR = os.path.join(os.path.dirname(__file__), "presets")
WEIGHTS_FILE = "model.weights.h5"
CARD_FILE = "metadata.json"
CONFIG_FILE = "config.json"
TASKS = ("classification", "retrieval", "few_shot")
_ARCHITECTURE_KEYS = ("backbone", "head", "num_classes", "input_shape", "pixel_mean", "pixel_std", "pooling",
                      "embedding_dim", "ways")


def sha256_of(path):
    """The hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _spec(name):
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}.")
    return PRESETS[name]


def list_models(task=None):
    """The preset names, sorted; only those of ``task`` (one of ``TASKS``) when given."""
    if task is not None and task not in TASKS:
        raise ValueError(f"`task` must be one of {list(TASKS)} or None, got {task!r}.")
    return sorted(name for name, spec in PRESETS.items() if task is None or spec["task"] == task)


def preset_dir(name):
    """The package directory of a built-in preset (it may not hold weights yet)."""
    _spec(name)
    return os.path.join(PRESETS_DIR, name)


def model_card(name):
    """The model card of preset ``name`` as a dict (task, data and split, recipe, metrics, parameters, sha256 of
    the weights, training time and hardware, the reproducing command, date). A preset whose weights have not been
    trained yet has ``metrics=None`` and ``weights_sha256=None``."""
    spec = _spec(name)
    path = os.path.join(preset_dir(name), CARD_FILE)
    if os.path.isfile(path):
        with open(path) as handle:
            return json.load(handle)
    return dict(name=name, task=spec["task"], dataset=spec["dataset"], split=spec["split"],
                description=spec["description"], recipe=dict(spec["recipe"]), metrics=None, weights_sha256=None,
                command=f"otzoo train {name}")


def _backbone(spec, l2):
    """The preset's feature extractor, named ``backbone``; ``l2`` applies to the CIFAR-style ResNets."""
    name = spec["backbone"]
    input_shape = tuple(spec["input_shape"])
    if name in ("resnet20", "resnet32", "resnet56"):
        return cifar_resnet(int(name[len("resnet"):]), input_shape, l2=l2, name="backbone")
    if l2:
        raise ValueError(f"`l2` applies to the CIFAR-style ResNet backbones only, not to {name!r}.")
    return resolve_backbone(name, input_shape)


def build(name, l2=0.0, **overrides):
    """The untrained architecture of preset ``name`` (a classifier, an embedding model or a few-shot model, by the
    preset's task; see :mod:`zoo.models` and :mod:`zoo.tasks`).

    ``overrides`` change the architecture (``num_classes``, ``input_shape``, ``head``, ``backbone``, ``pooling``,
    ``embedding_dim``, ``ways``, ``pixel_mean``, ``pixel_std``) or, for any other key, the head layer's arguments
    (the pooling layer's for retrieval presets; e.g. ``epsilon=0.05``). ``backbone`` may be any name in
    ``zoo.BACKBONES``. ``l2``: an L2 penalty on the ResNet backbone's convolution kernels (the recipes' weight decay).
    """
    spec = dict(_spec(name))
    layer_kwargs = dict(spec.get("pooling_kwargs" if spec["task"] == "retrieval" else "head_kwargs", {}))
    for key, value in overrides.items():
        if key in _ARCHITECTURE_KEYS:
            spec[key] = value
        else:
            layer_kwargs[key] = value
    if spec["task"] == "retrieval" and spec["pooling"] != "gsp":
        layer_kwargs = None
    backbone = _backbone(spec, l2)
    statistics = dict(pixel_mean=spec["pixel_mean"], pixel_std=spec["pixel_std"])
    if spec["task"] == "classification":
        return image_classifier(backbone, spec["head"], spec["num_classes"], head_kwargs=layer_kwargs, name=name,
                                **statistics)
    if spec["task"] == "retrieval":
        return embedding_model(backbone, spec["pooling"], spec["embedding_dim"], pooling_kwargs=layer_kwargs,
                               name=name, **statistics)
    return few_shot_model(backbone, spec["head"], spec["ways"], head_kwargs=layer_kwargs, name=name, **statistics)


def _check_hash(path, expected):
    found = sha256_of(path)
    if expected and found != expected:
        raise ValueError(f"The weights file {path} does not match the preset: expected sha256 {expected}, found "
                         f"{found}. The file is corrupted or belongs to another model.")


def _weights_path(name, weights, expected_sha256):
    """A local weights file from ``weights``: None (the package's), a file, a preset directory or a URL."""
    if weights is None:
        path = os.path.join(preset_dir(name), WEIGHTS_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"Preset {name!r} has no pretrained weights in this installation ({path}); "
                                    f"train them with `otzoo train {name}`, or pass `weights=` a file or URL.")
        _check_hash(path, expected_sha256)
        return path
    weights = str(weights)
    if weights.startswith(("http://", "https://")):
        if not expected_sha256:
            raise ValueError(f"`weights`: a URL needs the preset's sha256 in its card to check the download; "
                             f"preset {name!r} has none.")
        fname = f"{name}-{expected_sha256[:12]}.weights.h5"
        return keras.utils.get_file(fname, origin=weights, file_hash=expected_sha256, hash_algorithm="sha256",
                                    cache_subdir=os.path.join("otzoo", name))
    path = os.path.join(weights, WEIGHTS_FILE) if os.path.isdir(weights) else weights
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`weights`: no weights file at {path!r} (give a .weights.h5 file, a preset "
                                "directory holding model.weights.h5, or an http(s) URL).")
    return path


def load(name, pretrained=True, weights=None, **overrides):
    """Preset ``name`` built and, with ``pretrained``, loaded with its weights (no network needed for the built-in
    presets: their weights are package data, checked against the card's sha256).

    ``weights``: a local ``.weights.h5`` file, a directory holding ``model.weights.h5``, or an http(s) URL fetched
    with ``keras.utils.get_file`` into ``$KERAS_HOME`` and checked against the card's sha256. ``overrides`` go to
    :func:`build` (weights then load only if the shapes still match). A directory written by :func:`save_preset`
    (with a ``config.json``) loads as ``load(directory)``.
    """
    if name not in PRESETS and os.path.isdir(str(name)):
        return _load_directory(str(name))
    model = build(name, **overrides)
    if pretrained or weights is not None:
        card = model_card(name)
        model.load_weights(_weights_path(name, weights, card.get("weights_sha256")))
    return model


def save_preset(model, directory, card=None):
    """Write ``model`` as a preset directory (``config.json``, ``model.weights.h5``, ``metadata.json``) that
    :func:`load` reads back; ``card``: extra model-card fields (the weights' sha256 is added)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, CONFIG_FILE), "w") as handle:
        handle.write(model.to_json())
    weights = os.path.join(directory, WEIGHTS_FILE)
    model.save_weights(weights)
    card = dict(card or {}, weights_sha256=sha256_of(weights), parameters=int(model.count_params()))
    with open(os.path.join(directory, CARD_FILE), "w") as handle:
        json.dump(card, handle, indent=2)
    return directory


def _load_directory(directory):
    config = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(config):
        raise FileNotFoundError(f"{directory!r} is not a preset directory: it has no {CONFIG_FILE}.")
    with open(config) as handle:
        model = keras.models.model_from_json(handle.read())
    expected = None
    card_path = os.path.join(directory, CARD_FILE)
    if os.path.isfile(card_path):
        with open(card_path) as handle:
            expected = json.load(handle).get("weights_sha256")
    weights = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.isfile(weights):
        raise FileNotFoundError(f"{directory!r} has no {WEIGHTS_FILE}.")
    _check_hash(weights, expected)
    model.load_weights(weights)
    return model
