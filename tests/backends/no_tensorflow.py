"""Makes ``import tensorflow`` fail in this process, as on a machine with JAX or PyTorch and no TensorFlow (the GPU
machines otzoo's JAX runs are meant for): ``block_tensorflow()`` before anything imports Keras."""
import importlib.abc
import importlib.machinery
import sys


class NoTensorFlow(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes every ``import tensorflow...`` fail, as where it is not installed. ``find_spec`` answers with a spec
    that has no origin (what ``importlib.util.find_spec`` probes, e.g. PyTorch's dynamo, read as "nothing to
    trace") whose loading raises ``ModuleNotFoundError``."""

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r} (blocked by this check)", name=spec.name)

    def exec_module(self, module):  # pragma: no cover - create_module always raises
        raise ModuleNotFoundError(module.__name__)


def block_tensorflow():
    """Install :class:`NoTensorFlow` first on ``sys.meta_path``."""
    sys.meta_path.insert(0, NoTensorFlow())
