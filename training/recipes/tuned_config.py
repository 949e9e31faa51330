"""The ``best.json`` that ``otzoo tune`` writes and ``otzoo train --config`` reads."""
import json
import os

from zoo.loading import build

CONFIG_FORMAT = "otzoo-tuning/1"


def load_tuned_config(path, preset=None):
    """Read a configuration written by :func:`tune`: ``{"preset", "head_kwargs", "learning_rate", ...}``.

    ``preset``: when given, the file must be for that preset, and its ``head_kwargs`` must build that preset's head
    (checked on a small backbone, so a wrong key or value stops here, not after the data are read). Bad files raise
    ``ValueError`` naming ``config``.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`config`: no tuning result at {path!r} (run `otzoo tune PRESET --out DIR`).")
    try:
        with open(path) as handle:
            config = json.load(handle)
    except json.JSONDecodeError as error:
        raise ValueError(f"`config` {path!r} is not valid JSON ({error}).") from None
    ok = isinstance(config, dict) and isinstance(config.get("preset"), str) \
        and isinstance(config.get("head_kwargs"), dict) and isinstance(config.get("learning_rate"), (int, float)) \
        and config["learning_rate"] > 0
    if not ok:
        raise ValueError(f"`config` {path!r} must hold 'preset' (str), 'head_kwargs' (dict) and 'learning_rate' "
                         "(> 0), as written by `otzoo tune`.")
    if preset is not None and config["preset"] != preset:
        raise ValueError(f"`config` {path!r} was tuned for preset {config['preset']!r}, not {preset!r}.")
    if preset is not None:
        try:  # the head is what the file changes; the small backbone builds in a moment
            build(preset, **{**config["head_kwargs"], "backbone": "small_convnet"})
        except (ValueError, TypeError) as error:
            raise ValueError(f"`config` {path!r}: its head_kwargs {config['head_kwargs']} do not fit preset "
                             f"{preset!r}: {str(error).splitlines()[0]}") from None
    return config
