"""Optional dependencies, imported where they are used: a missing one ends in one line naming the extra.

The core install (``pip install otzoo``) holds TensorFlow, Keras, NumPy, SciPy and POT; the rest comes with an
extra (``setup.cfg``): ``export`` (tf2onnx, onnx, onnxruntime, tensorflow-serving-api), ``explain``
(matplotlib), ``tune`` (keras-tuner), ``data`` (tensorflow-datasets).
"""
import importlib
import importlib.util


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it (``otzoo`` maps it
    to exit status 2)."""


def _message(module_name, extra, feature):
    return (f"{feature or 'this feature'} needs {module_name.partition('.')[0]}, which is not installed: "
            f"pip install \"otzoo[{extra}]\"")


def require(module_name, extra, feature=None):
    """Import and return ``module_name``; raise :class:`MissingExtraError` naming ``extra`` when it (or a package
    it lives in) is not installed. An installed module whose own import fails keeps its error."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise MissingExtraError(_message(module_name, extra, feature), name=module_name) from None
        raise


def check_installed(module_name, extra, feature=None):
    """Like :func:`require` without importing: for a module another process will import (e.g. onnxruntime in the
    isolated verification child)."""
    try:
        found = importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):  # a parent package missing, or None in sys.modules
        found = False
    if not found:
        raise MissingExtraError(_message(module_name, extra, feature), name=module_name)
