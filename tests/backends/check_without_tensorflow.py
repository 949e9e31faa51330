"""``ot_layers`` and ``zoo`` on JAX or PyTorch in a process where TensorFlow cannot be imported (as on a machine
that has JAX or PyTorch with CUDA and no TensorFlow): the packages import, and every preset whose layers run on the
backend loads its packaged weights and predicts finite outputs. Not applicable on TensorFlow.

    KERAS_BACKEND=torch python tests/backends/check_without_tensorflow.py
"""
import importlib.abc
import importlib.machinery
import os
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


if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
    sys.meta_path.insert(0, NoTensorFlow())

import keras  # noqa: E402
import numpy as np  # noqa: E402

from backend_tools import BACKEND, Report  # noqa: E402

report = Report("without_tensorflow")
if BACKEND == "tensorflow":
    report.record["not_applicable"] = "the check blocks TensorFlow"
    report.finish()

import ot_layers  # noqa: E402, F401
import zoo  # noqa: E402

report.expect("tensorflow_not_loaded", "tensorflow" not in sys.modules)
images = np.random.default_rng(0).integers(0, 256, size=(4, 28, 28, 1)).astype(np.float32)
for name in ("resnet20_mpw_fashion_mnist", "resnet20_gap_fashion_mnist", "resnet20_hyperspherical_fashion_mnist",
             "resnet20_gap_retrieval_fashion_mnist", "resnet20_gsp_retrieval_fashion_mnist"):
    outputs = keras.ops.convert_to_numpy(zoo.load(name)(images, training=False))
    report.expect(f"{name}_finite", bool(np.all(np.isfinite(outputs))), str(outputs.shape))
report.finish()
