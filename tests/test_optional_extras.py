"""Optional dependencies: with an extra's package unimportable, the feature that needs it stops with one line naming
the extra (``pip install "otzoo[EXTRA]"``), ``otzoo`` turns that into exit status 2, and the packages themselves
still import (the core install runs ``otzoo list/train/evaluate/demo``). scripts/check_wheel.sh checks the same on
a real core install of the wheel."""
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

import explain
import export
import otzoo.cli
from export.warmup import WARMUP_DIR
from ot_layers.optional import AbsentModule, MissingExtraError, check_installed, require, tensorflow_if_installed
from training.data.tfds import tfds_dataset
from training.recipes.common import run_options
from training.tuning.search import tune

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = "resnet20_mpw_fashion_mnist"


def _block(monkeypatch, *modules):
    """Make ``modules`` (and every already imported sub-module) unimportable, as if not installed."""
    for module in modules:
        for name in [m for m in sys.modules if m == module or m.startswith(module + ".")] + [module]:
            monkeypatch.setitem(sys.modules, name, None)


def _one_line(error, module, extra):
    message = str(error)
    assert "\n" not in message
    assert f"needs {module}" in message and message.endswith(f'pip install "otzoo[{extra}]"'), message
    return message


def _dense_classifier():
    inputs = keras.Input((3,), name="images")
    return keras.Model(inputs, keras.layers.Dense(4, name="dense_head")(inputs))


def test_require_imports_or_names_the_extra(monkeypatch):
    assert require("json", "export") is sys.modules["json"]
    with pytest.raises(MissingExtraError) as raised:
        require("otzoo_no_such_module.sub", "tune", "a feature")
    assert str(raised.value) == ('a feature needs otzoo_no_such_module, which is not installed: '
                                 'pip install "otzoo[tune]"')
    assert isinstance(raised.value, ImportError)
    with pytest.raises(MissingExtraError, match=r'otzoo\[data\]'):
        check_installed("otzoo_no_such_module", "data")
    check_installed("json", "data")
    _block(monkeypatch, "tf2onnx")
    with pytest.raises(MissingExtraError):
        check_installed("tf2onnx", "export")


def test_tensorflow_if_installed_stands_in_where_tensorflow_is_missing(monkeypatch):
    """With TensorFlow installed it is the module; without it (a JAX or PyTorch machine) a stand-in whose use names
    the feature; a missing dependency of an installed TensorFlow keeps its own error."""
    import importlib

    import tensorflow as tf

    assert tensorflow_if_installed("tf.data pipelines") is tf
    real = importlib.import_module

    def missing(name, error_name):
        def fake(module_name, *args):
            if module_name == "tensorflow":
                raise ModuleNotFoundError(f"No module named {error_name!r}", name=error_name)
            return real(module_name, *args)
        return fake

    monkeypatch.setattr(importlib, "import_module", missing("tensorflow", "tensorflow"))
    stand_in = tensorflow_if_installed("tf.data pipelines")
    assert isinstance(stand_in, AbsentModule)
    with pytest.raises(ModuleNotFoundError, match=r"tf\.data pipelines needs tensorflow, which is not installed here"):
        stand_in.data.Dataset
    monkeypatch.setattr(importlib, "import_module", missing("tensorflow", "otzoo_missing_dependency"))
    with pytest.raises(ModuleNotFoundError, match="otzoo_missing_dependency"):
        tensorflow_if_installed("tf.data pipelines")


def test_a_broken_installed_module_keeps_its_own_error(tmp_path, monkeypatch):
    (tmp_path / "otzoo_broken_module.py").write_text("import otzoo_missing_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as raised:
        require("otzoo_broken_module", "export")
    assert not isinstance(raised.value, MissingExtraError) and raised.value.name == "otzoo_missing_dependency"


def test_the_packages_import_without_any_extra():
    blocked = ["tf2onnx", "onnx", "onnxruntime", "tensorflow_serving", "matplotlib", "PIL", "keras_tuner",
               "tensorflow_datasets", "sklearn", "tensorboard"]
    code = ("import sys\n"
            f"for name in {blocked!r}:\n    sys.modules[name] = None\n"
            "import export, explain, otzoo.cli, training.tuning.search, training.data.tfds, "
            "training.evaluation.retrieval\n"
            "print('imported')\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert child.returncode == 0 and child.stdout.strip() == "imported", child.stderr[-3000:]


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_ot_layers_on_another_backend_does_not_import_tensorflow(backend):
    # POT, which the exact EMD uses, imports every framework installed unless told not to
    pytest.importorskip(backend)
    code = ("import sys, ot_layers, ot\n"
            "print('tensorflow' in sys.modules, ot.backend.NumpyBackend is not None)\n")
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("PYTHONPATH", None)
    env.pop("POT_BACKEND_DISABLE_TENSORFLOW", None)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert child.returncode == 0, child.stderr[-3000:]
    assert child.stdout.split() == ["False", "True"]


def test_onnx_export_names_the_export_extra(tmp_path, monkeypatch):
    _block(monkeypatch, "tf2onnx")
    with pytest.raises(MissingExtraError) as raised:
        export.to_onnx(_dense_classifier(), str(tmp_path / "model.onnx"))
    _one_line(raised.value, "tf2onnx", "export")
    assert not os.listdir(tmp_path)


def test_onnx_verification_names_the_export_extra(tmp_path, monkeypatch):
    _block(monkeypatch, "onnxruntime")
    with pytest.raises(MissingExtraError) as raised:
        export.verify(_dense_classifier(), np.zeros((2, 3), np.float32), onnx_path=str(tmp_path / "model.onnx"))
    _one_line(raised.value, "onnxruntime", "export")


def test_saved_model_without_tensorflow_serving(tmp_path, monkeypatch):
    """Warm-up requests need tensorflow-serving-api: ``warmup=True`` refuses before writing anything, the default
    warns and writes the SavedModel and models.config without them."""
    _block(monkeypatch, "tensorflow_serving")
    model = _dense_classifier()
    with pytest.raises(MissingExtraError) as raised:
        export.to_saved_model(model, str(tmp_path / "refused"), warmup=True)
    _one_line(raised.value, "tensorflow_serving", "export")
    assert not os.path.exists(tmp_path / "refused")
    with pytest.warns(UserWarning, match=r'otzoo\[export\]'):
        version_dir = export.to_saved_model(model, str(tmp_path / "served"))
    assert sorted(os.listdir(tmp_path / "served")) == ["1", "models.config"]
    assert not os.path.exists(os.path.join(version_dir, WARMUP_DIR))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        export.to_saved_model(model, str(tmp_path / "cold"), warmup=False)


def test_models_config_is_what_the_proto_writes():
    """``models.config`` is written without tensorflow-serving-api; it equals the ``ModelServerConfig`` proto's text
    format (ASCII escapes) and parses back to the same fields."""
    text_format = pytest.importorskip("google.protobuf.text_format")
    config_pb2 = pytest.importorskip("tensorflow_serving.config.model_server_config_pb2")
    from export.saved_model import model_config_text

    for name, path in [("m", "/srv/models/m"), ("a.b-c_1", '/tmp/with space/"quoted"\\back\ttab\nnewline'),
                       ("u", "/tmp/\u00e9t\u00e9/\u4e2d\u6587/\x01\x7f")]:
        proto = config_pb2.ModelServerConfig()
        proto.model_config_list.config.add(name=name, base_path=path, model_platform="tensorflow")
        text = model_config_text(name, path)
        assert text == text_format.MessageToString(proto, as_utf8=False)
        assert text.isascii()
        assert text_format.Parse(text, config_pb2.ModelServerConfig()) == proto


def test_explain_pictures_name_the_explain_extra(tmp_path, monkeypatch):
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss,val_loss\n0,1.0,1.2\n1,0.5,0.9\n")
    _block(monkeypatch, "matplotlib")
    with pytest.raises(MissingExtraError) as raised:
        explain.plot_training_curves(str(log), str(tmp_path / "curves.png"))
    _one_line(raised.value, "matplotlib", "explain")
    assert not os.path.exists(tmp_path / "curves.png")


def test_tuning_names_the_tune_extra(tmp_path, monkeypatch):
    _block(monkeypatch, "keras_tuner")
    with pytest.raises(MissingExtraError) as raised:
        tune(PRESET, 1, str(tmp_path / "tune"))
    _one_line(raised.value, "keras_tuner", "tune")


def test_tfds_names_the_data_extra(monkeypatch):
    _block(monkeypatch, "tensorflow_datasets")
    with pytest.raises(MissingExtraError) as raised:
        tfds_dataset("cifar10", "train", 8)
    _one_line(raised.value, "tensorflow_datasets", "data")


def test_tensorboard_logs_name_the_tune_extra(tmp_path, monkeypatch):
    _block(monkeypatch, "tensorboard")
    with pytest.raises(MissingExtraError) as raised:
        run_options(PRESET, strategy="one_device", tensorboard=str(tmp_path / "logs"))
    _one_line(raised.value, "tensorboard", "tune")


def test_tensorboard_logs_without_tensorflow_are_one_line(tmp_path, monkeypatch):
    """Keras' TensorBoard callback writes with ``tf.summary`` on every backend: on a machine without TensorFlow,
    ``--tensorboard`` is refused before the run starts, in one line naming the option and what to do instead (it
    failed after the run directory was claimed, with a traceback from inside Keras)."""
    _block(monkeypatch, "tensorflow")
    with pytest.raises(MissingExtraError) as raised:
        run_options(PRESET, strategy="one_device", tensorboard=str(tmp_path / "logs"))
    message = str(raised.value)
    assert "\n" not in message and message.startswith("--tensorboard (Keras writes TensorBoard logs with tf.summary) "
                                                      "needs tensorflow, which is not installed here")
    assert "train without --tensorboard" in message and not (tmp_path / "logs").exists()


@pytest.mark.parametrize("module", ["tf2onnx", "onnx", "onnxruntime", "tensorflow_serving"])
def test_otzoo_export_exits_2_with_one_line(module, tmp_path, monkeypatch, capsys):
    _block(monkeypatch, module)
    out = tmp_path / "exported"
    assert otzoo.cli.main(["export", PRESET, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("otzoo export: error: "), captured.err
    _one_line(lines[0], module, "export")
    assert not out.exists()  # refused before loading or writing anything


def test_otzoo_export_of_onnx_only_needs_no_tensorflow_serving(tmp_path, monkeypatch, capsys):
    """The check follows --format: an ONNX-only export does not ask for tensorflow-serving-api (it gets as far as
    the missing tf2onnx here)."""
    _block(monkeypatch, "tensorflow_serving", "tf2onnx")
    assert otzoo.cli.main(["export", PRESET, "--format", "onnx", "--out", str(tmp_path / "x")]) == 2
    assert "needs tf2onnx" in capsys.readouterr().err


def test_otzoo_tune_exits_2_naming_the_tune_extra(tmp_path, monkeypatch, capsys):
    _block(monkeypatch, "keras_tuner")
    assert otzoo.cli.main(["tune", PRESET, "--out", str(tmp_path / "tune")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("otzoo tune: error: "), lines
    _one_line(lines[0], "keras_tuner", "tune")
