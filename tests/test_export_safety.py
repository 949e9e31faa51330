"""What export refuses and what it never leaves behind: unexportable layers, Python ops, half-written versions, an
environment that could import otzoo, bad arguments."""
import hashlib
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import export
import zoo
from export import isolation
from export import saved_model as saved_model_module
from export.isolation import BLOCKED_PACKAGES, REPOSITORY_ROOT, run_isolated

TINY = dict(input_shape=(16, 16, 1), backbone_kwargs={"width": 4, "feature_dim": 4})
_IMPORT_ALL = "\n".join(f"import {name}" for name in BLOCKED_PACKAGES if name != "explain") + "\nprint('imported')"


def _tree_digest(path):
    """sha256 over every file's relative path and bytes under ``path``."""
    digest = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            digest.update(os.path.relpath(full, path).encode())
            with open(full, "rb") as handle:
                digest.update(handle.read())
    return digest.hexdigest()


def _dense_classifier():
    inputs = keras.Input((3,), name="images")
    return keras.Model(inputs, keras.layers.Dense(4, name="dense_head")(inputs))


def test_isolated_child_cannot_import_the_project_while_a_plain_child_can():
    """The same interpreter imports every project package when started normally (from a neutral directory, through
    the editable install), and none of them in the child :func:`export.verify` uses; TensorFlow still imports."""
    plain = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True, cwd=os.sep,
                           env=dict(os.environ, PYTHONPATH=REPOSITORY_ROOT))
    assert plain.returncode == 0 and "imported" in plain.stdout, plain.stderr[-2000:]
    for name in BLOCKED_PACKAGES:
        child = run_isolated(f"import {name}")
        assert child.returncode != 0
        assert f"ModuleNotFoundError: {name!r} is blocked" in child.stderr
    child = run_isolated("import numpy, onnxruntime; print('imported')")
    assert child.returncode == 0 and child.stdout.strip() == "imported", child.stderr[-2000:]


def test_isolated_child_of_a_regular_install_still_imports_numpy_and_tensorflow(monkeypatch):
    """In a regular (non-editable) install the project's packages live in ``site-packages`` beside NumPy and
    TensorFlow: the child must keep that directory on ``sys.path`` and refuse the project by name only."""
    site_packages = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    monkeypatch.setattr(isolation, "REPOSITORY_ROOT", site_packages)
    child = run_isolated("import sys, numpy, tensorflow; print(sys.argv[1] in sys.path)", [site_packages])
    assert child.returncode == 0 and child.stdout.strip().splitlines()[-1] == "True", child.stderr[-2000:]
    code = ("import importlib, sys\nfor name in sys.argv[1:]:\n    try:\n        importlib.import_module(name)\n"
            "        print(name, 'imported')\n    except ModuleNotFoundError as error:\n        print(name, 'blocked' if "
            "'is blocked' in str(error) else error)\n")
    child = run_isolated(code, list(BLOCKED_PACKAGES))
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split("\n")[:-1] == [f"{name} blocked" for name in BLOCKED_PACKAGES]
    assert "otzoo" in BLOCKED_PACKAGES


def test_exact_emd_is_refused_naming_sinkhorn_and_writes_nothing(tmp_path):
    model = zoo.few_shot_model("small_convnet", "emd", 2, head_kwargs={"method": "exact"}, **TINY)
    with pytest.raises(ValueError, match='method="sinkhorn"'):
        export.to_saved_model(model, str(tmp_path / "served"))
    with pytest.raises(ValueError, match='method="sinkhorn"'):
        export.to_onnx(model, str(tmp_path / "model.onnx"))
    assert os.listdir(tmp_path) == []


def test_versions_count_up_and_are_never_replaced(tmp_path):
    model = _dense_classifier()
    base = str(tmp_path / "served")
    assert export.to_saved_model(model, base, warmup=False) == os.path.join(base, "1")
    assert export.to_saved_model(model, base, version=7, warmup=False) == os.path.join(base, "7")
    assert export.to_saved_model(model, base, warmup=False) == os.path.join(base, "8")
    before = _tree_digest(os.path.join(base, "7"))
    with pytest.raises(ValueError, match="`version` 7 already exists"):
        export.to_saved_model(model, base, version=7)
    assert _tree_digest(os.path.join(base, "7")) == before
    assert sorted(os.listdir(base)) == ["1", "7", "8", "models.config"]
    assert not os.path.exists(os.path.join(base, "1", "assets.extra"))  # warmup=False


def test_a_failing_export_leaves_existing_versions_and_no_stray_files(tmp_path, monkeypatch):
    """A failure after the SavedModel is written (while adding the warm-up requests) removes the temporary
    directory: version 1 keeps its bytes, no version 2 appears, and a base directory the export created goes."""
    model = _dense_classifier()
    base = str(tmp_path / "served")
    export.to_saved_model(model, base)
    before = _tree_digest(base)
    reached = []

    def fail_midway(version_dir, spec, name):
        assert os.path.isfile(os.path.join(version_dir, "saved_model.pb"))  # the SavedModel is already written
        reached.append(version_dir)
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(saved_model_module, "write_warmup_requests", fail_midway)
    with pytest.raises(OSError, match="simulated"):
        export.to_saved_model(model, base)
    with pytest.raises(OSError, match="simulated"):
        export.to_saved_model(model, str(tmp_path / "fresh"))
    assert len(reached) == 2 and not any(os.path.exists(p) for p in reached)
    assert _tree_digest(base) == before
    assert sorted(os.listdir(base)) == ["1", "models.config"]
    assert sorted(os.listdir(tmp_path)) == ["served"]


def test_onnx_failure_leaves_the_previous_file(tmp_path, monkeypatch):
    model = _dense_classifier()
    path = str(tmp_path / "model.onnx")
    export.to_onnx(model, path)
    with open(path, "rb") as handle:
        before = handle.read()
    import onnx

    def fail(proto, target):
        with open(target, "wb") as handle:
            handle.write(b"partial")
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(onnx, "save", fail)
    with pytest.raises(OSError, match="simulated"):
        export.to_onnx(model, path)
    with open(path, "rb") as handle:
        assert handle.read() == before
    assert os.listdir(tmp_path) == ["model.onnx"]


def test_python_ops_in_the_saved_model_are_reported(tmp_path):
    """A model whose graph calls back into Python (``tf.py_function`` -> ``EagerPyFunc``) exports, but TF Serving
    could not run it: :func:`export.verify` finds the op in the SavedModel's function library."""
    inputs = keras.Input((3,), name="features")
    doubled = keras.layers.Lambda(
        lambda x: tf.ensure_shape(tf.py_function(lambda t: 2.0 * t, [x], tf.float32), [None, 3]),
        output_shape=(3,))(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(doubled))
    x = np.ones((2, 3), np.float32)
    version_dir = export.to_saved_model(model, str(tmp_path / "served"), warmup=False)
    with pytest.raises(export.VerificationError, match=r"holds Python ops.*EagerPyFunc"):
        export.verify(model, x, saved_model_dir=version_dir)


def test_bad_arguments_name_the_argument(tmp_path):
    model = _dense_classifier()
    x = np.zeros((2, 3), np.float32)
    for version in (0, -1, 1.5, "2", True, 2 ** 63):  # TF Serving's versions are int64
        with pytest.raises(ValueError, match="`version`"):
            export.to_saved_model(model, str(tmp_path / "a"), version=version)
    with pytest.raises(ValueError, match="`task`"):
        export.to_saved_model(model, str(tmp_path / "a"), task="segmentation")
    with pytest.raises(ValueError, match="`name`"):
        export.to_saved_model(model, str(tmp_path / "a"), name="two words")
    with pytest.raises(ValueError, match="`opset`"):
        export.to_onnx(model, str(tmp_path / "m.onnx"), opset=7)
    with pytest.raises(ValueError, match="`batch_sizes`"):
        export.verify(model, x, batch_sizes=(0,))
    with pytest.raises(ValueError, match="`inputs`"):
        export.verify(model, [x, x])
    with pytest.raises(ValueError, match="`reference`"):
        export.verify(model, x, reference="xla")
    assert os.listdir(tmp_path) == []


def test_paths_flags_models_and_inputs_are_named_before_any_artifact_is_written_or_run(tmp_path):
    """Output paths that cannot be written (an empty base_dir wrote ./1 into the working directory; a directory at
    the ONNX path failed after the conversion, naming a temporary file), warmup="no" (read as true), a model that
    is not a Keras model (an AttributeError from a layer walk), and, in verify, no artifact (an empty report that
    checked nothing), a base directory for a version directory, a batch size above the examples (a report for a
    batch never run) and inputs of another shape, dtype or name (TensorFlow's binding error, or ignored)."""
    model = _dense_classifier()
    x = np.zeros((6, 3), np.float32)
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir.onnx").mkdir()
    for call, match in [
        (lambda: export.to_saved_model(model, ""), "^`base_dir` is empty"),
        (lambda: export.to_saved_model(model, None), "^`base_dir` must be a directory path"),
        (lambda: export.to_saved_model(model, str(tmp_path / "afile")), "^`base_dir` .* is a file"),
        (lambda: export.to_saved_model(model, str(tmp_path / "afile" / "x")), "^`base_dir` .* is below the file"),
        (lambda: export.to_saved_model(model, str(tmp_path / "s"), warmup="no"), "^`warmup` must be True or False"),
        (lambda: export.to_saved_model("resnet", str(tmp_path / "s")), "^`model` must be a built keras.Model"),
        (lambda: export.to_onnx(model, str(tmp_path / "adir.onnx")), "^`path` .* is a directory"),
        (lambda: export.to_onnx(model, ""), "^`path` is empty"),
        (lambda: export.to_onnx(None, str(tmp_path / "m.onnx")), "^`model` must be a built keras.Model"),
        (lambda: export.verify(model, x), "^`saved_model_dir` and `onnx_path` are both None"),
        (lambda: export.verify(model, x, onnx_path=str(tmp_path / "missing.onnx")), "^`onnx_path` must be an"),
        (lambda: export.verify(model, np.zeros((6, 5)), onnx_path="m.onnx"), r"^`inputs` 'images' must have shape"),
        (lambda: export.verify(model, np.float32(1), onnx_path="m.onnx"), r"^`inputs` 'images' must have shape"),
        (lambda: export.verify(model, np.full((2, 3), "a"), onnx_path="m.onnx"), "^`inputs` 'images' must hold"),
        (lambda: export.verify(model, {"images": x, "imgs": x}, onnx_path="m.onnx"), r"has unknown \['imgs'\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
    assert sorted(os.listdir(tmp_path)) == ["adir.onnx", "afile"]
    base = str(tmp_path / "served")
    version_dir = export.to_saved_model(model, base, warmup=False)
    with pytest.raises(ValueError, match=r"^`saved_model_dir` .* holds no saved_model.pb \(a base directory: pass "
                                         r"its version directory, e.g. '.*served/1'\)"):
        export.verify(model, x, saved_model_dir=base)
    with pytest.raises(ValueError, match="^`batch_sizes`: 100 is more than the 6 example"):
        export.verify(model, x, saved_model_dir=version_dir, batch_sizes=(1, 100))
    # NumPy integers count as integers, as they do for batch_sizes
    assert export.to_saved_model(model, base, version=np.int64(3), warmup=False).endswith(os.sep + "3")


def test_models_config_is_replaced_with_a_warning_only_when_it_differs(tmp_path):
    import warnings

    model = _dense_classifier()
    base = str(tmp_path / "served")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a first export, and a second with the same entry: no warning
        export.to_saved_model(model, base, warmup=False)
        export.to_saved_model(model, base, warmup=False)
    config = os.path.join(base, "models.config")
    with pytest.warns(UserWarning, match="replacing .*models.config, which differs"):
        export.to_saved_model(model, base, warmup=False, name="renamed")
    with open(config) as handle:
        assert 'name: "renamed"' in handle.read()
    with open(config, "a") as handle:
        handle.write("# edited by hand\n")
    with pytest.warns(UserWarning, match="which differs"):
        export.to_saved_model(model, base, warmup=False, name="renamed")
    assert sorted(os.listdir(base)) == ["1", "2", "3", "4", "models.config"]


def _python_op_model():
    """A model whose graph calls back into Python (``tf.numpy_function`` -> ``PyFunc``): no ONNX op exists for it."""
    inputs = keras.Input((3,), name="features")
    doubled = keras.layers.Lambda(
        lambda x: tf.ensure_shape(tf.numpy_function(lambda t: 2.0 * t, [x], tf.float32), [None, 3]),
        output_shape=(3,))(inputs)
    return keras.Model(inputs, doubled)


def test_an_onnx_conversion_that_no_runtime_loads_is_refused_and_keeps_the_earlier_file(tmp_path):
    """tf2onnx only logs what it cannot convert and returns a model no runtime loads: such a model is refused with
    one line (naming the unconverted op where there is one) before anything is written; a good file already at the
    path keeps its bytes and a missing parent directory is not created. Three ways: an unconverted TensorFlow op, a
    model ``onnx.checker`` rejects (bfloat16 weights beside float32 inputs) and one it accepts but onnxruntime has no
    kernel for (float64 Softplus)."""
    path = str(tmp_path / "model.onnx")
    export.to_onnx(_dense_classifier(), path)
    with open(path, "rb") as handle:
        before = handle.read()
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    inputs = keras.Input((3,), name="features")
    bfloat16 = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    keras.mixed_precision.set_dtype_policy("float64")
    inputs = keras.Input((3,), name="features")
    float64_softplus = keras.Model(inputs, keras.layers.Activation("softplus")(inputs))
    keras.mixed_precision.set_dtype_policy("float32")
    cases = [(_python_op_model(), r"^`model` cannot be converted to ONNX: tf2onnx could not convert the TensorFlow "
                                  r"op\(s\) PyFunc;"),
             (bfloat16, r"^`model` converts to an invalid ONNX model: .*MatMul")]
    pytest.importorskip("onnxruntime")
    cases.append((float64_softplus, r"^`model` converts to an ONNX model onnxruntime cannot load: .*Softplus"))
    for model, match in cases:
        for target in (path, str(tmp_path / "new" / "model.onnx")):
            with pytest.raises(export.OnnxConversionError, match=match) as raised:
                export.to_onnx(model, target)
            assert isinstance(raised.value, ValueError) and len(str(raised.value).splitlines()) == 1
        with open(path, "rb") as handle:
            assert handle.read() == before
        assert os.listdir(tmp_path) == ["model.onnx"]


def test_a_failed_export_removes_the_parent_directories_it_created(tmp_path, monkeypatch):
    """``base_dir`` (or the ONNX file's folder) several levels below what exists: a failure removes every directory
    the export created, and keeps a directory that existed before (with what it holds)."""
    model = _dense_classifier()
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")

    def fail(*args):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(saved_model_module, "_write_signatures", fail)
    for base in (tmp_path / "a" / "b" / "served", tmp_path / "kept" / "c" / "served"):
        with pytest.raises(OSError, match="simulated"):
            export.to_saved_model(model, str(base), warmup=False)
    import onnx

    monkeypatch.setattr(onnx, "save", fail)
    with pytest.raises(OSError, match="simulated"):
        export.to_onnx(model, str(tmp_path / "d" / "e" / "model.onnx"))
    assert sorted(os.listdir(tmp_path)) == ["kept"]
    assert os.listdir(tmp_path / "kept") == ["notes.txt"]


def test_dict_or_nested_inputs_and_outputs_and_subclassed_models_are_refused_naming_model():
    """Export builds its signatures positionally: a functional model with dict or nested inputs or outputs is refused
    in one line naming ``model`` (it crashed deep in TensorFlow). A subclassed model has no symbolic inputs in Keras
    3, called or not: the message says how to wrap it, and the wrapped model is accepted."""
    features, extra = keras.Input((4,), name="features"), keras.Input((2,), name="extra")
    joined = keras.layers.Concatenate()([features, extra])
    models = {
        "a dict of outputs": keras.Model(features, {"b": keras.layers.Dense(2)(features),
                                                    "a": keras.layers.Dense(3)(features)}),
        "a dict of inputs": keras.Model({"extra": extra, "features": features}, joined),
        "a nested structure of inputs": keras.Model([features, [extra]], joined),
        "a nested structure of outputs": keras.Model(features, [[keras.layers.Dense(2)(features)], features]),
    }
    for kind, model in models.items():
        for call in (lambda: export.serving_spec(model), lambda: export.to_onnx(model, "unused.onnx")):
            with pytest.raises(ValueError, match=f"^`model` has {kind}; export serves one tensor or a flat list") \
                    as raised:
                call()
            assert len(str(raised.value).splitlines()) == 1

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    subclassed = Subclassed()
    subclassed(np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"^`model` must be a built keras.Model .*a subclassed model has none: wrap "
                                         r"it, inputs = keras.Input\(shape\); keras.Model\(inputs, model\(inputs\)\)"):
        export.serving_spec(subclassed)
    inputs = keras.Input((4,), name="features")
    assert export.serving_spec(keras.Model(inputs, subclassed(inputs))).input_names == ("features",)


def test_verify_with_another_task_than_the_export_is_one_line_naming_task(tmp_path):
    """An export made for another task takes other inputs: the child process failed inside TensorFlow or onnxruntime
    and its long traceback was the error. The child now reads the artifact's names before running it, and verify
    raises one line naming `task`; an artifact that fails for another reason still gives the child's traceback."""
    inputs = keras.Input((3,), name="features")
    model = keras.Model(inputs, keras.layers.Dense(4)(inputs))
    x = np.zeros((2, 3), np.float32)
    served = export.to_saved_model(model, str(tmp_path / "served"), task="classification", warmup=False)
    onnx_path = export.to_onnx(model, str(tmp_path / "model.onnx"), task="classification")
    for artifact in (dict(saved_model_dir=served), dict(onnx_path=onnx_path)):
        with pytest.raises(ValueError, match=r"^`task`=None \(the task `model` states, 'generic'\) serves "
                                             r"\['features'\].* takes \['images'\]") as error:
            export.verify(model, x, **artifact)
        assert len(str(error.value).splitlines()) == 1 and "Traceback" not in str(error.value)
    assert export.verify(model, x, saved_model_dir=served, task="classification")["saved_model"] <= 1e-5
    generic = export.to_saved_model(model, str(tmp_path / "generic"), warmup=False)
    pixels = np.zeros((2, 3), np.uint8)  # runs serving_uint8 too, which a generic export lacks
    with pytest.raises(ValueError, match=r"^`task`='classification' serves \['images'\]") as error:
        export.verify(model, pixels, saved_model_dir=generic, task="classification")
    assert len(str(error.value).splitlines()) == 1
    (tmp_path / "damaged.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(export.VerificationError, match="failed:\nTraceback") as error:
        export.verify(model, x, onnx_path=str(tmp_path / "damaged.onnx"))
    assert "onnxruntime" in str(error.value)
