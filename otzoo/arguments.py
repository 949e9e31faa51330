"""What the command line accepts: ``argparse`` types that name the bad value, and the error of a user's input.

Every sub-command's bad input (an unknown preset, a non-positive count, an empty data slice, a missing file) ends
in one line naming the option and exit status 2 (:class:`CommandError`, or ``argparse``'s own error); anything
else is a bug and keeps its traceback.
"""
import argparse
import math
import os

from ot_layers.validation import MAX_SEED
from zoo.preset_format import CARD_FILE, WEIGHTS_FILE, is_weights_url, output_directory_problem
from training.recipes.common import card_base_preset
from zoo.loading import shadowed_directory
from zoo.registry import PRESETS


class CommandError(Exception):
    """An error in the user's input, printed as one line with exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose errors are one line and exit status 2, and whose options are spelled out: no abbreviations
    (``--work`` for ``--workers``), so a command relaunched with some options removed removes every spelling."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text):
    """An ``argparse`` type: an integer >= 1."""
    return _integer_at_least(text, 1)


def non_negative_int(text):
    """An ``argparse`` type: an integer >= 0 (a seed, an index)."""
    return _integer_at_least(text, 0)


def seed_value(text):
    """An ``argparse`` type: a random seed, an integer in ``0 .. 2**32 - 1``."""
    value = _integer_at_least(text, 0)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be an integer <= {MAX_SEED} (a 32-bit seed), got {text!r}")
    return value


MAX_VERSION = 2 ** 63 - 1  # TF Serving's ModelSpec.version is an int64


def serving_version(text):
    """An ``argparse`` type: a SavedModel version, an integer in ``1 .. 2**63 - 1`` (TF Serving's int64)."""
    value = _integer_at_least(text, 1)
    if value > MAX_VERSION:
        raise argparse.ArgumentTypeError(f"must be an integer <= {MAX_VERSION} (TF Serving's int64 versions), got "
                                         f"{text!r}")
    return value


def _integer_at_least(text, low):
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
    return value


def positive_number(text):
    """An ``argparse`` type: a number > 0."""
    return _number(text, lambda value: value > 0, "a number > 0")


def open_fraction(text):
    """An ``argparse`` type: a number in (0, 1)."""
    return _number(text, lambda value: 0.0 < value < 1.0, "a number in (0, 1)")


def _number(text, accept, what):
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or not accept(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def output_directory(text):
    """An ``argparse`` type: a directory to write into, existing or not (then created): not a file, nor below one,
    so that a run does not fail on it after its work is done."""
    return _checked_directory(text, new_preset=False)


def new_preset_directory(text):
    """An ``argparse`` type: :func:`output_directory` that does not hold a preset already (its ``metadata.json`` or
    ``config.json``), so a packaged or earlier preset is never replaced by a write into it."""
    return _checked_directory(text, new_preset=True)


def default_output_directory(path):
    """``path``, a command's default output directory (``otzoo_runs/PRESET``, ``otzoo_tune/PRESET``), checked as
    :func:`output_directory` checks a given ``--out`` (``argparse`` checks only what is given); else a
    :class:`CommandError` naming ``--out``."""
    problem = output_directory_problem(path)
    if problem:
        raise CommandError(f"--out (default {path}): {problem}; or give --out.")
    return path


def _checked_directory(text, new_preset):
    problem = output_directory_problem(text, new_preset)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def preset_name(text):
    """An ``argparse`` type: the name of a built-in preset."""
    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown preset {text!r}; known presets: {', '.join(sorted(PRESETS))}")
    return text


def recipe_item(text):
    """An ``argparse`` type: ``FIELD=VALUE`` (``--recipe``). Checked as the option is read, so ``--recipe optimizer
    adam`` names ``--recipe`` rather than ending in "unrecognized arguments: adam"."""
    field, sep, _ = text.partition("=")
    if not sep or not field.strip():
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE (e.g. optimizer=adam, no spaces around =), got "
                                         f"{text!r}")
    return text


def ambiguous_preset(text):
    """The problem with ``text`` when it is a built-in preset's name and a preset directory here too (as ``otzoo
    fine-tune P --out P`` leaves), which a command would otherwise read as the preset without a word; else ``None``."""
    local = shadowed_directory(text)
    if local is not None:
        return (f"{text!r} is both a built-in preset and a preset directory here: write {local} for the directory, "
                "or run from another folder for the preset")
    return None


# The commands that load a built-in preset's packaged weights by its name and take no preset directory in its place
# (the others take PRESET_OR_DIR, and refuse a bare name that is a preset directory here too as ambiguous).
PACKAGED_WEIGHTS_COMMANDS = ("demo",)
DEMO_PRESET = "resnet20_mpw_fashion_mnist"  # the preset otzoo demo loads


def packaged_weights_note(command, name):
    """The line for ``otzoo COMMAND`` (one of :data:`PACKAGED_WEIGHTS_COMMANDS`), which loads the built-in preset
    ``name`` by its name, where the working directory holds a preset directory ``./NAME`` too: that the command loads
    the packaged weights, and which commands take the directory. ``zoo.load``'s own warning names
    ``zoo.load('./NAME')``, Python's way, which a command-line user cannot write. ``None`` where nothing else would
    load."""
    if command not in PACKAGED_WEIGHTS_COMMANDS:
        return None
    local = shadowed_directory(name)
    if local is None:
        return None
    return (f"{name} is the built-in preset with its packaged weights, not the preset directory {local} here; otzoo "
            f"{command} takes built-in presets only (otzoo evaluate, export, fine-tune and explain take {local})")


def directory_preset(directory, card):
    """The built-in preset the card of preset directory ``directory`` comes from
    (:func:`training.recipes.common.card_base_preset`), whose recipe evaluates, fine-tunes and explains it; else a
    :class:`CommandError` naming ``PRESET`` and the directory."""
    try:
        return card_base_preset(card)
    except ValueError as error:
        raise CommandError(f"PRESET: the card of {directory!r}: {error}") from None


def preset_or_directory(text):
    """An ``argparse`` type: the name of a built-in preset or a preset directory (one holding ``metadata.json``); a
    bare preset name that is also a preset directory here (``otzoo fine-tune P --out P``) is refused as ambiguous."""
    problem = ambiguous_preset(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    if text in PRESETS or os.path.isfile(os.path.join(text, CARD_FILE)):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a preset "
                                     f"directory (one holding {CARD_FILE})")


def weights_location(text):
    """An ``argparse`` type: a weights file, a preset directory holding ``model.weights.h5``, or an http(s) URL
    (what ``zoo.load(..., weights=)`` reads)."""
    if is_weights_url(text):
        return text
    path = os.path.join(text, WEIGHTS_FILE) if os.path.isdir(text) else text
    if not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"no weights file at {path!r} (give a .weights.h5 file, a preset directory "
                                         f"holding {WEIGHTS_FILE}, or an http(s) URL)")
    return text
