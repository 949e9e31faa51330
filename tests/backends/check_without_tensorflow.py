"""``ot_layers`` and ``zoo`` on JAX or PyTorch in a process where TensorFlow cannot be imported (as on a machine
that has JAX or PyTorch with CUDA and no TensorFlow): the packages import, and every preset whose layers run on the
backend loads its packaged weights and predicts finite outputs. The command line (``otzoo.cli``, with ``training``,
``export`` and ``explain``) imports too, and a TensorFlow-only feature, used there, names itself and TensorFlow in
its error. Not applicable on TensorFlow.

    KERAS_BACKEND=torch python tests/backends/check_without_tensorflow.py
"""
import os
import sys

from no_tensorflow import block_tensorflow

if os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow":
    block_tensorflow()

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

import otzoo.cli  # noqa: E402, F401
from training.distributed.strategies import make_strategy  # noqa: E402

report.expect("cli_imports_without_tensorflow", "tensorflow" not in sys.modules)
try:
    make_strategy("mirrored")
    report.expect("tensorflow_feature_refused", False, "make_strategy('mirrored') ran without TensorFlow")
except ModuleNotFoundError as error:
    report.expect("tensorflow_feature_refused", "tf.distribute strategies needs tensorflow" in str(error), str(error))
# A missing optional package is named by itself, not by its otzoo extra (which would install TensorFlow too); an
# option that needs TensorFlow names TensorFlow before the package it would also need.
from ot_layers.optional import MissingExtraError, require  # noqa: E402
from training.recipes.common import run_options  # noqa: E402

sys.modules["PIL"] = sys.modules["PIL.Image"] = None  # Pillow (installed here) as if it were not: pip's name differs
for module, requirement in (("matplotlib_absent_here.pyplot", "matplotlib_absent_here"), ("PIL.Image", "pillow")):
    try:
        require(module, "explain", "drawing explain pictures")
        report.expect(f"missing_{requirement}_named", False, f"{module} imported")
    except MissingExtraError as error:
        report.expect(f"missing_{requirement}_named", str(error).startswith(
            f"drawing explain pictures needs {module.partition('.')[0]}, which is not installed: pip install "
            f'"{requirement}" (the otzoo[explain] extra would also install TensorFlow)'), str(error))
try:
    run_options(None, "one_device", tensorboard="tensorboard_logs")
    report.expect("tensorboard_refused", False, "--tensorboard was accepted without TensorFlow")
except MissingExtraError as error:
    report.expect("tensorboard_refused", str(error).startswith("--tensorboard (Keras writes TensorBoard logs with "
                                                               "tf.summary) needs tensorflow"), str(error))
report.finish()
