"""otzoo's command line (``otzoo``, ``python -m otzoo``): the one place that brings the data, the recipes, export
and explain together. ``otzoo.cli.main(argv=None)`` runs it and returns the exit status (``otzoo.launch.main``, the
entry point, first says in one line when the library of Keras' backend is not installed)."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported

BACKENDS = ("tensorflow", "jax", "torch")


def backend_option(argv):
    """The value of ``--backend NAME`` / ``--backend=NAME`` in ``argv``, or None."""
    for index, item in enumerate(argv):
        if item == "--backend" and index + 1 < len(argv):
            return argv[index + 1]
        if item.startswith("--backend="):
            return item.split("=", 1)[1]
    return None


# ``otzoo --backend jax ...`` picks the Keras backend, which must happen before Keras is imported: the command line's
# own process sets KERAS_BACKEND here (otzoo.cli checks the choice and says when it came too late).
if os.path.basename(sys.argv[0]) in ("otzoo", "__main__.py", "-m") and backend_option(sys.argv[1:]) in BACKENDS:
    os.environ["KERAS_BACKEND"] = backend_option(sys.argv[1:])

__version__ = "0.2.0"
