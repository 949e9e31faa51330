"""Test set-up: two logical CPU devices (for MirroredStrategy) before TensorFlow starts, quiet logs; Fashion-MNIST
tests skipped where the data set is not installed, and under ``OTZOO_REQUIRE_REFERENCES`` (CI) a missing data set
or reference package an error instead."""
import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
try:
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
except RuntimeError:  # already initialized by an earlier import
    pass


@pytest.fixture(autouse=True)
def _reset_policy_and_seed():
    import keras

    keras.utils.set_random_seed(0)
    yield
    keras.mixed_precision.set_dtype_policy("float32")


# The references tests compare against, skipped where missing (pytest.importorskip) unless OTZOO_REQUIRE_REFERENCES
# is set, as CI sets it (.ci/run).
REFERENCE_MODULES = ("ot", "scipy", "sklearn", "onnxruntime", "tf2onnx", "torch", "jax", "pytorch_metric_learning",
                     "tensorflow_datasets", "tensorflow_serving", "google.protobuf")


def pytest_collection_modifyitems(config, items):
    from training.data.errors import DataUnavailableError
    from training.data.fashion_mnist import fashion_mnist_dir

    try:
        installed = fashion_mnist_dir() is not None
    except DataUnavailableError:  # $OTZOO_FASHION_MNIST names a folder without the files
        installed = False
    if os.environ.get("OTZOO_REQUIRE_REFERENCES", "").lower() in ("1", "true", "yes"):  # CI: they must run
        missing = [name for name in REFERENCE_MODULES if importlib.util.find_spec(name) is None]
        missing += [] if installed else ["Fashion-MNIST (apt-get install dataset-fashion-mnist)"]
        if missing:
            raise pytest.UsageError(f"OTZOO_REQUIRE_REFERENCES is set but these are missing: {', '.join(missing)}")
    if not installed:
        skip = pytest.mark.skip(reason="Fashion-MNIST IDX files not installed (apt-get install dataset-fashion-mnist)")
        for item in items:
            if "fashion_mnist" in item.keywords:
                item.add_marker(skip)
