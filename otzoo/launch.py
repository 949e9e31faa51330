"""The ``otzoo`` command's entry point (the ``otzoo`` script and ``python -m otzoo``).

The command line's modules import Keras, and Keras imports the library of its backend (TensorFlow unless
``KERAS_BACKEND``, ``otzoo --backend`` or ``keras.json`` says otherwise). Where that library is not installed (a
machine with JAX or PyTorch only, say), :func:`main` says so in one line naming ``backend`` and the backends that
are installed, with exit status 2, instead of Keras' traceback, and so for a backend Keras does not know; any other
import error keeps its traceback.
"""
import importlib.util
import json
import os
import sys

from otzoo import BACKENDS, backend_option


def configured_backend(argv):
    """``(backend, where it was chosen)`` as Keras will read it: ``--backend``, else ``KERAS_BACKEND``, else the
    ``backend`` of ``keras.json`` in ``$KERAS_HOME`` or ``~/.keras``, else Keras' default, TensorFlow."""
    option = backend_option(argv)
    if option in BACKENDS:
        return option, f"--backend {option}"
    if os.environ.get("KERAS_BACKEND"):
        return os.environ["KERAS_BACKEND"], "KERAS_BACKEND"
    path = os.path.join(os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras"), "keras.json")
    try:
        with open(path) as handle:
            return json.load(handle)["backend"], path
    except (OSError, ValueError, KeyError, TypeError):
        return "tensorflow", "Keras' default"


def installed_backends():
    """The Keras backends whose library is installed here."""
    return [name for name in BACKENDS if importlib.util.find_spec(name) is not None]


def missing_backend_message(backend, chosen_by, installed):
    others = [name for name in installed if name != backend]
    advice = (f"run otzoo --backend {others[0]} ... ({', '.join(others)} installed here), or pip install {backend}"
              if others else f"pip install {backend} (no Keras backend library is installed here: tensorflow, jax "
                             f"or torch)")
    return f"backend: Keras runs on {backend} ({chosen_by}), which is not installed: {advice}"


# Read before Keras is imported (its first import writes a keras.json naming its default); the command line's own
# process chose the backend from its arguments (otzoo/__init__).
BACKEND, CHOSEN_BY = configured_backend(sys.argv[1:])
if BACKEND not in BACKENDS:  # Keras would raise "Unable to import backend" with a traceback
    run_command_line, MISSING_BACKEND = None, (f"backend: Keras cannot run on {BACKEND!r} ({CHOSEN_BY}); otzoo runs "
                                               f"on {', '.join(BACKENDS)}")
else:
    try:
        from otzoo.cli import main as run_command_line
        MISSING_BACKEND = None
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != BACKEND:
            raise
        run_command_line, MISSING_BACKEND = None, missing_backend_message(BACKEND, CHOSEN_BY, installed_backends())


def main(argv=None):
    """Run the ``otzoo`` command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    if MISSING_BACKEND is not None:
        print(f"otzoo: error: {MISSING_BACKEND}", file=sys.stderr)
        return 2
    return run_command_line(argv)
