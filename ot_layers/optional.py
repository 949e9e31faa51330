"""Optional dependencies, imported where they are used: a missing one ends in one line naming the extra (where
TensorFlow is not installed, the package: the extra would install otzoo's TensorFlow too).

The core install (``pip install .`` in a checkout, or the wheel) holds TensorFlow, Keras, NumPy, SciPy and POT;
the rest comes with an extra (``setup.cfg``): ``export`` (tf2onnx, onnx, onnxruntime, tensorflow-serving-api),
``explain`` (matplotlib), ``tune`` (keras-tuner), ``data`` (tensorflow-datasets).
"""
import importlib
import importlib.util
import sys


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that installs it (``otzoo`` maps it
    to exit status 2)."""


# The pip requirement of an extra's package where it differs from its import name (setup.cfg's extras).
PIP_REQUIREMENTS = {"PIL": "pillow", "keras_tuner": "keras-tuner>=1.4.8", "matplotlib": "matplotlib>=3.7",
                    "onnxruntime": "onnxruntime>=1.20", "tensorflow_datasets": "tensorflow-datasets>=4.9",
                    "tensorflow_serving": "tensorflow-serving-api>=2.21,<2.22", "tf2onnx": "tf2onnx>=1.17"}


def _message(module_name, extra, feature):
    package = module_name.partition(".")[0]
    install = f'pip install "otzoo[{extra}]"'
    if not _tensorflow_installed():  # a JAX or PyTorch machine: the extra would install otzoo's TensorFlow too
        install = (f'pip install "{PIP_REQUIREMENTS.get(package, package)}" (the otzoo[{extra}] extra would also '
                   "install TensorFlow)")
    return f"{feature or 'this feature'} needs {package}, which is not installed: {install}"


def _tensorflow_installed():
    """Whether TensorFlow is imported or importable, found without importing it (unlike
    :func:`_installed_tensorflow`: an error message must not start TensorFlow). A spec without an origin (a folder
    left by an uninstall, or an import blocker's) is not an install."""
    if sys.modules.get("tensorflow") is not None:
        return True
    try:
        spec = importlib.util.find_spec("tensorflow")
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


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


def _installed_tensorflow():
    """The ``tensorflow`` module, or ``None`` where it is not installed; an import error of another module (a broken
    install) keeps its traceback."""
    try:
        return importlib.import_module("tensorflow")
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] != "tensorflow":
            raise
        return None


def require_tensorflow(feature, advice):
    """Import and return ``tensorflow`` for ``feature``, a part that needs TensorFlow on any Keras backend (e.g.
    Keras' TensorBoard callback, which writes with ``tf.summary``); where it is not installed (a machine with JAX or
    PyTorch only) raise :class:`MissingExtraError` naming the feature, with ``advice`` (what to do instead)."""
    tf = _installed_tensorflow()
    if tf is None:
        raise MissingExtraError(f"{feature} needs tensorflow, which is not installed here: pip install tensorflow, "
                                f"or {advice}", name="tensorflow")
    return tf


class AbsentModule:
    """Stands for a library that is not installed, in a module that needs it only for some of its functions: any
    use of an attribute raises ``ModuleNotFoundError`` naming the library and the ``feature`` that needs it."""

    def __init__(self, module_name, feature, advice):
        self._module_name, self._feature, self._advice = module_name, feature, advice

    def __getattr__(self, attribute):
        raise ModuleNotFoundError(f"{self._feature} needs {self._module_name}, which is not installed here"
                                  f"{self._advice}", name=self._module_name)

    def __repr__(self):
        return f"<{self._module_name}: not installed>"


def tensorflow_if_installed(feature):
    """The ``tensorflow`` module, or where it is not installed (a machine with JAX or PyTorch only) an
    :class:`AbsentModule` that names ``feature`` (a TensorFlow-backend feature: ``tf.data`` pipelines,
    ``tf.distribute``, the exporters) when it is used. The modules that import TensorFlow this way import without it,
    so the parts that run on JAX and PyTorch (``otzoo --backend jax train``, ``evaluate``, ``fine-tune``) do too."""
    tf = _installed_tensorflow()
    if tf is None:
        return AbsentModule("tensorflow", feature, "; it runs on the TensorFlow backend (pip install tensorflow, "
                                                   "KERAS_BACKEND=tensorflow)")
    return tf
