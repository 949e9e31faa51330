"""The preset format, read and written in one place.

A preset -- built-in (package data, ``zoo/presets/<name>/``) or saved by a user (:func:`write_preset`,
``zoo.save_preset``) -- is a directory holding:

- ``config.json``: the Keras model config (``model.to_json()`` less how it was compiled; an ``ot_layers.TaskModel``,
  so it states the task);
- ``model.weights.h5``: the weights;
- ``metadata.json``: the model card, with at least ``task`` and ``weights_sha256``.

Wherever a card names a sha256 the weights file is hashed *before* it is loaded; a mismatch is one
:class:`WeightsIntegrityError` (a ``ValueError``) naming the file and both hashes. Weights that no card accompanies
load with a warning that they are unchecked (:func:`load_weights`). Deserializing ``config.json`` needs the
``ot_layers`` layers registered, which importing this module (through ``ot_layers``) does.
"""
import copy
import hashlib
import json
import os
import random
import re
import secrets
import warnings

import keras

import ot_layers  # noqa: F401  (registers the layers and TaskModel that config.json names)
from ot_layers.task_model import check_task, graph_problem, model_task, with_task
from ot_layers.validation import check_flag, check_output_path, output_path_problem

WEIGHTS_FILE = "model.weights.h5"
CARD_FILE = "metadata.json"
CONFIG_FILE = "config.json"


class WeightsIntegrityError(ValueError):
    """A weights file whose sha256 is not the one its card names (corrupted, or another model's)."""


class MissingWeightsError(FileNotFoundError):
    """A built-in preset whose package holds no trained weights (a preset added but not trained yet)."""


class WeightsDownloadError(ConnectionError):
    """Weights at a URL that could not be fetched (an address that does not answer, or answers with an HTTP
    error)."""


class PresetFormatError(ValueError):
    """A preset directory or weights file that cannot be read as the format says: a card that is not JSON, a
    missing weights file, weights that do not fit the model they are loaded into."""


def preset_files(path):
    """The files of a preset that directory ``path`` holds already (its card, its config), which a preset written
    into it would replace."""
    return [name for name in (CARD_FILE, CONFIG_FILE) if os.path.isfile(os.path.join(str(path), name))]


def output_directory_problem(path, new_preset=False):
    """Why ``path`` cannot be a directory to write into, or ``None``: it must be an existing directory or none yet
    (then created), not a file nor below one; with ``new_preset``, also not a directory that holds a preset already
    (its card or its config, :func:`preset_files`), which a write would replace."""
    problem = output_path_problem(path, directory=True)
    if problem:
        return problem
    held = preset_files(path) if new_preset else []
    if held:
        return (f"{path!r} holds a preset already ({', '.join(held)}); write into another directory, or remove that "
                "one first")
    return None


def check_output_directory(name, path, new_preset=False):
    """Raise one ``ValueError`` naming ``name`` where :func:`output_directory_problem` finds one; checked before a
    run's work, so that the run does not fail on its output after it."""
    problem = output_directory_problem(path, new_preset)
    if problem:
        raise ValueError(f"`{name}` {problem}.")
    return path


def sha256_of(path):
    """The hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path, expected):
    """Raise :class:`WeightsIntegrityError` unless the sha256 of file ``path`` is ``expected`` (hex digits, in either
    case)."""
    expected = expected.strip().lower() if isinstance(expected, str) else expected
    found = sha256_of(path)
    if found != expected:
        raise WeightsIntegrityError(f"The weights file {path} does not match its card: expected sha256 {expected}, "
                                    f"found {found}. The file is corrupted or belongs to another model.")


def card_sha256(card, where):
    """The ``weights_sha256`` of ``card`` (a dict or ``None``) in lower case, ``None`` where it names none; a value
    that is not a sha256 (64 hex digits, in either case, as ``sha256sum`` or ``Get-FileHash`` print it) is a
    :class:`PresetFormatError` naming the field and ``where`` (the card, in words), not a corrupted file."""
    value = (card or {}).get("weights_sha256")
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"[0-9a-fA-F]{64}", value.strip()):
        return value.strip().lower()
    raise PresetFormatError(f"{where}: `weights_sha256` must be the weights' sha256 (64 hex digits), got {value!r}.")


def is_preset_dir(path):
    """Whether ``path`` is a directory holding a ``config.json`` (a preset directory)."""
    return os.path.isdir(str(path)) and os.path.isfile(os.path.join(str(path), CONFIG_FILE))


def read_card(directory):
    """The card (``metadata.json``) of ``directory`` as a dict, or ``None`` when it has none."""
    path = os.path.join(str(directory), CARD_FILE)
    if not os.path.isfile(path):
        return None
    return _read_json_object(path, "the card")


def _read_json_object(path, what):
    """The JSON object in the file ``path``; :class:`PresetFormatError` naming ``what`` and the file when it is not
    JSON or not an object."""
    with open(path, encoding="utf-8") as handle:
        try:
            value = json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:  # JSON is UTF-8 text
            raise PresetFormatError(f"{what} {path!r} is not valid JSON ({error}).") from None
    if not isinstance(value, dict):
        raise PresetFormatError(f"{what} {path!r} must hold a JSON object, got {type(value).__name__}.")
    return value


def read_config(directory):
    """The (untrained) model ``config.json`` of ``directory`` describes."""
    path = os.path.join(str(directory), CONFIG_FILE)
    if not os.path.isfile(path):
        raise PresetFormatError(f"the preset directory {directory!r} has no {CONFIG_FILE} (a preset directory holds "
                                f"{CONFIG_FILE}, {WEIGHTS_FILE} and {CARD_FILE}).")
    config = _read_json_object(path, "the model config")
    config.pop("compile_config", None)  # not part of a preset (see write_config); an older one may hold it
    try:
        return model_from_config(config)
    except (ValueError, TypeError, KeyError) as error:  # a config Keras cannot rebuild: the file, not a bug
        raise PresetFormatError(f"the model config {path!r} does not describe a model Keras can build: "
                                f"{_first_line(error)}") from error


def _first_line(error):
    return (str(error).splitlines() or [type(error).__name__])[0] or type(error).__name__


def model_from_config(config):
    """The model the dict ``config`` (a ``config.json``'s contents) describes, as :func:`read_config` rebuilds it:
    what ``keras.models.model_from_json`` does after parsing, in safe mode (no Python lambda is deserialized); a
    ``ValueError`` when what it gives is not a model with a graph of layers (:func:`ot_layers.task_model.graph_problem`:
    ``{}``, a layer's config)."""
    model = keras.saving.deserialize_keras_object(config)
    if not isinstance(model, keras.Model):
        raise ValueError(f"it gives a {type(model).__name__}, not a model")
    problem = graph_problem(model)
    if problem:
        raise ValueError(f"the model it gives {problem}")
    return model


def is_weights_url(weights):
    """Whether ``weights`` (as ``zoo.load(..., weights=)`` takes them) is an http(s) URL rather than a path."""
    return str(weights).startswith(("http://", "https://"))


def weights_directory(weights):
    """The directory whose card and training log go with ``weights``: ``weights`` itself when it is a directory,
    the folder of a preset's ``model.weights.h5``; ``None`` for a weights file of another name or a URL."""
    weights = str(weights)
    if os.path.isdir(weights):
        return weights
    if not is_weights_url(weights) and os.path.basename(weights) == WEIGHTS_FILE:
        return os.path.dirname(weights) or "."
    return None


def weights_with_card(weights):
    """``(weights file, card or None)`` for ``weights``: a ``.weights.h5`` file (its card: the ``metadata.json``
    beside it when the file is a preset's ``model.weights.h5``) or a directory holding ``model.weights.h5`` (its
    card: the directory's ``metadata.json``)."""
    weights = str(weights)
    path = os.path.join(weights, WEIGHTS_FILE) if os.path.isdir(weights) else weights
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`weights`: no weights file at {path!r} (give a .weights.h5 file, a preset "
                                f"directory holding {WEIGHTS_FILE}, or an http(s) URL).")
    directory = weights_directory(weights)
    return path, read_card(directory) if directory is not None else None


def load_weights(model, path, card):
    """Load the weights file ``path`` into ``model`` after checking it against ``card``'s ``weights_sha256``
    (:func:`card_sha256`); with no card (or a card naming no sha256) the weights load with a warning that they are
    unchecked."""
    expected = card_sha256(card, f"the card that goes with the weights {path!r}")
    if expected:
        check_sha256(path, expected)
    else:
        warnings.warn(f"Loading weights {path} without a card naming their sha256: they are not checked for "
                      "corruption or for belonging to this model.", stacklevel=3)
    try:
        model.load_weights(path)
    except (ValueError, OSError) as error:  # another architecture's weights, or no weights file (h5py's OSError)
        raise PresetFormatError(f"the weights {path!r} do not load into {model.name!r}: "
                                f"{_load_failure(error)}") from error
    return model


def _load_failure(error):
    """Why Keras could not load a weights file, in one line. Keras' message on objects that did not load is
    paragraphs: a count, one object's reason (a shape mismatch goes on with the variable's values), their list."""
    text = str(error)
    paragraphs = [paragraph for paragraph in text.split("\n\n") if paragraph.strip()]
    if not re.match(r"A total of \d+ objects could not be loaded", text) or len(paragraphs) < 2:
        return text.splitlines()[0] if text else type(error).__name__
    reason = paragraphs[1].splitlines()[0]
    shapes = re.search(r"variable\.shape=(\(.*?\)), Received: value\.shape=(\(.*?\))", reason)
    variable = re.search(r"Target variable: <Variable path=([^,>]+)", reason)
    if shapes and variable:
        reason = f"{variable.group(1)} has shape {shapes.group(1)} in the model and {shapes.group(2)} in the file"
    names = re.findall(r"name=([^,>]+)", paragraphs[-1]) if "could not be loaded:" in paragraphs[-1] else []
    return f"{reason.rstrip('.')} (not loaded: {', '.join(names)})" if names else reason


def preset_card(directory):
    """The model card of preset directory ``directory`` (:func:`read_card`); a ``FileNotFoundError`` naming the
    directory when it has none."""
    card = read_card(str(directory))
    if card is None:
        raise FileNotFoundError(f"{str(directory)!r} is not a preset directory: it has no {CARD_FILE} (the model "
                                "card naming the task and the weights' sha256).")
    return card


def load_preset(directory):
    """The model of preset directory ``directory``: ``config.json`` deserialized, stating the card's ``task``,
    with ``model.weights.h5`` checked against the card's sha256 and loaded."""
    directory = str(directory)
    card = preset_card(directory)
    path = os.path.join(directory, WEIGHTS_FILE)
    if not os.path.isfile(path):
        raise PresetFormatError(f"the preset directory {directory!r} has no {WEIGHTS_FILE}.")
    expected = card_sha256(card, f"the card of {directory!r}")
    if expected:
        check_sha256(path, expected)  # before anything is deserialized
    model = read_config(directory)
    if card.get("task") is not None:
        try:
            model = with_task(model, card["task"])
        except ValueError as error:  # a task the model's structure cannot serve, or no task at all
            raise PresetFormatError(f"the card of {directory!r}: {error}") from None
    return load_weights(model, path, card)


def model_config(model):
    """``model``'s ``config.json`` contents: ``model.to_json()`` less how the model was compiled.

    A preset is the architecture and the weights; the user compiles it, as a built-in preset. On PyTorch Keras'
    optimizer is a class of its torch backend, which another backend cannot import where PyTorch is missing and whose
    import aborts a TensorFlow process beside it."""
    config = json.loads(model.to_json())
    config["compile_config"] = {}
    return config


def write_config(model, directory):
    """Write ``model``'s ``config.json`` (:func:`model_config`) into ``directory``."""
    with open(os.path.join(directory, CONFIG_FILE), "w") as handle:
        json.dump(model_config(model), handle)


def write_preset(model, directory, card, overwrite=False):
    """Write ``model`` as preset directory ``directory`` (``config.json``, ``model.weights.h5``, ``metadata.json``);
    returns ``directory``. ``model``: a functional or ``Sequential`` Keras model with a known input, whose config
    :func:`read_config` can rebuild (no Python lambda, no layer class Keras cannot find): checked before anything
    is written, else a ``ValueError`` naming ``model``. ``card``: the model card's fields; its ``task`` (or the task
    ``model`` states) is required. The card written adds ``task``, ``weights_sha256`` and ``parameters``.

    A directory that holds a preset already (:func:`preset_files`: its card or its config) is refused with a
    ``ValueError`` naming ``directory`` unless ``overwrite=True``, which replaces those three files (any other file
    there is left as it is). The files are written under temporary names in ``directory`` first and then renamed
    over the old ones, the card last, so a write that fails (a full disk, an error while saving the weights)
    leaves the earlier preset as it was; only a failure between the three renames (each atomic) can leave new
    weights beside the old card, which ``zoo.load`` then refuses by its sha256."""
    problem = graph_problem(model)
    if problem:
        raise ValueError(f"`model` {problem}.")
    directory = check_output_path("directory", directory, True)
    overwrite = check_flag("overwrite", overwrite)
    held = preset_files(directory)
    if held and not overwrite:
        raise ValueError(f"`directory` {directory!r} holds a preset already ({', '.join(held)}); write into another "
                         "directory, or pass overwrite=True to replace it.")
    if card is not None and not isinstance(card, dict):
        raise ValueError(f"`card` must be a dict of the model card's fields (or None), got {type(card).__name__}.")
    card = dict(card or {})
    try:  # before anything is written: a card that cannot be written would leave a preset without one
        json.dumps(card)
    except (TypeError, ValueError) as error:
        raise ValueError(f"`card` must hold JSON values (strings, numbers, lists, dicts): {error}.") from None
    task = card.get("task") or model_task(model)
    if task is None:
        raise ValueError("`card`: a preset states its task: give card={'task': ...} (one of classification, "
                         "retrieval, few_shot, generic) or a model that states one (ot_layers.TaskModel).")
    model = with_task(model, check_task(task))
    config = model_config(model)
    # A preset that zoo.load could never read back is not written. Rebuilding draws the new layers' default seeds
    # from Python's random module (keras.random.make_default_seed): its state is put back, so that what a seeded
    # program makes after saving (weights, keras.random draws) is the same as without the check.
    seeds = random.getstate()
    try:
        model_from_config(copy.deepcopy(config))  # Keras takes the config apart as it reads it
    except (ValueError, TypeError, KeyError) as error:
        raise ValueError(f"`model` cannot be saved as a preset: its config does not rebuild as zoo.load reads it "
                         f"back: {_first_line(error)}") from error
    finally:
        random.setstate(seeds)
    _write_files(directory, config, model, card, task)
    return directory


def _write_files(directory, config, model, card, task):
    """Write the preset's three files into ``directory`` (made if need be) under temporary names, then rename each
    over its own name, the card last; on any failure the temporary files (and ``directory``, when made here and left
    empty) are removed, and the files already there stay as they were."""
    made = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    token = secrets.token_hex(6)
    staged = {name: os.path.join(directory, f".{token}-{name}") for name in (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE)}
    try:
        with open(staged[CONFIG_FILE], "x") as handle:
            json.dump(config, handle)
        model.save_weights(staged[WEIGHTS_FILE])  # its name still ends in .weights.h5, as Keras requires
        card.update(task=task, weights_sha256=sha256_of(staged[WEIGHTS_FILE]), parameters=int(model.count_params()))
        with open(staged[CARD_FILE], "x") as handle:
            json.dump(card, handle, indent=2)
        for name in (CONFIG_FILE, WEIGHTS_FILE, CARD_FILE):  # the card last: it names the weights it goes with
            os.replace(staged[name], os.path.join(directory, name))
            del staged[name]
    except BaseException:
        for path in staged.values():
            if os.path.exists(path):
                os.remove(path)
        if made and not os.listdir(directory):
            os.rmdir(directory)
        raise
