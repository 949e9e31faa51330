"""The ``best.json`` that ``otzoo tune`` writes and ``otzoo train --config`` reads."""
import json
import math
import os

from zoo.loading import build

CONFIG_FORMAT = "otzoo-tuning/1"


def load_tuned_config(path, preset=None):
    """Read a configuration written by :func:`tune`: ``{"preset", "head_kwargs", "learning_rate", ...}``.

    ``preset``: when given, the file must be for that preset. Bad files raise ``ValueError`` naming ``config``
    (:func:`check_tuned_head` also checks that its ``head_kwargs`` build the preset's head).
    """
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        raise FileNotFoundError(f"`config`: no tuning result at {path!r} (run `otzoo tune PRESET --out DIR`).")
    try:
        with open(path) as handle:
            config = json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"`config` {path!r} is not valid JSON ({error}).") from None
    ok = isinstance(config, dict) and isinstance(config.get("preset"), str) \
        and isinstance(config.get("head_kwargs"), dict) and isinstance(config.get("learning_rate"), (int, float)) \
        and not isinstance(config["learning_rate"], bool) and math.isfinite(config["learning_rate"]) \
        and config["learning_rate"] > 0
    if not ok:
        raise ValueError(f"`config` {path!r} must hold 'preset' (str), 'head_kwargs' (dict) and 'learning_rate' "
                         "(a finite number > 0), as written by `otzoo tune`.")
    if preset is not None and config["preset"] != preset:
        raise ValueError(f"`config` {path!r} was tuned for preset {config['preset']!r}, not {preset!r}.")
    return config


def check_tuned_head(path, config, preset):
    """Raise ``ValueError`` naming ``config`` (the file at ``path``) unless ``config["head_kwargs"]`` build preset
    ``preset``'s head, so that a wrong key or value stops a run before its data are read.

    The check builds the preset on a small backbone: a Keras model, which starts the backend's runtime. On
    TensorFlow, call it only in a process that will not then create a ``MultiWorkerMirroredStrategy`` (collective
    ops must be configured before the runtime starts)."""
    try:
        build(preset, **{**config["head_kwargs"], "backbone": "small_convnet"})
    except (ValueError, TypeError) as error:
        raise ValueError(f"`config` {path!r}: its head_kwargs {config['head_kwargs']} do not fit preset "
                         f"{preset!r}: {str(error).splitlines()[0]}") from None
