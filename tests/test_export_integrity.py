"""What an export check must never miss and what an export must not withhold: NaN outputs fail the parity check
(on either side, or both), and the artifacts get the permissions the process's umask gives any new file, so a TF
Serving or onnxruntime process under another user can read them."""
import math
import os
import stat

import keras
import numpy as np
import pytest

import export
from export.verification import ParityReport, _difference

X = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)


def _dense_classifier(nan=False):
    """A three-feature, four-class classifier; ``nan``: its weights are NaN, so every output is NaN."""
    inputs = keras.Input((3,), name="images")
    model = keras.Model(inputs, keras.layers.Dense(4, name="dense_head")(inputs))
    kernel, bias = model.get_layer("dense_head").get_weights()
    rng = np.random.default_rng(0)
    kernel, bias = rng.normal(size=kernel.shape).astype(np.float32), rng.normal(size=bias.shape).astype(np.float32)
    if nan:
        kernel, bias = np.full_like(kernel, np.nan), np.full_like(bias, np.nan)
    model.get_layer("dense_head").set_weights([kernel, bias])
    return model


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    """A finite and an all-NaN classifier with their SavedModels (the same architecture and signatures)."""
    base = str(tmp_path_factory.mktemp("integrity") / "served")
    models = {"finite": _dense_classifier(), "nan": _dense_classifier(nan=True)}
    dirs = {kind: export.to_saved_model(model, base, task="classification", warmup=False)
            for kind, model in models.items()}
    return models, dirs


def _fails(report, atol=1e-5):
    """Every way a caller reads a report says the check failed: each value is above any tolerance and not <= it."""
    values = [report["saved_model"]] + list(report.per_output["saved_model"].values())
    return (all(not value <= atol for value in values) and report["saved_model"] > atol
            and max(report.values()) > atol)


def test_a_model_whose_outputs_are_nan_fails_the_parity_check(versions):
    """Keras and the SavedModel both give NaN everywhere (a model trained with learning rate NaN): NaN is never a
    right answer, so the report must not read 0 (``max(0.0, nan)`` is 0.0)."""
    models, dirs = versions
    assert np.isnan(keras.ops.convert_to_numpy(models["nan"](X))).all()
    report = export.verify(models["nan"], X, saved_model_dir=dirs["nan"], task="classification", batch_sizes=(1, 4))
    assert _fails(report), report.table()
    assert math.isinf(report["saved_model"])
    assert "logits" in report.nan_outputs["saved_model"]
    assert "nan" in report.table()


def test_nan_on_one_side_only_fails_the_parity_check(versions):
    """An artifact that gives NaN where Keras does not, and Keras NaN where the artifact does not."""
    models, dirs = versions
    for model, artifact in (("finite", "nan"), ("nan", "finite")):
        report = export.verify(models[model], X, saved_model_dir=dirs[artifact], task="classification",
                               batch_sizes=(1,))
        assert _fails(report), (model, artifact, report.table())
        assert "logits" in report.nan_outputs["saved_model"]
    healthy = export.verify(models["finite"], X, saved_model_dir=dirs["finite"], task="classification")
    assert healthy["saved_model"] <= 1e-5 and not healthy.nan_outputs["saved_model"], healthy.table()


def test_a_nan_anywhere_in_an_output_is_an_infinite_difference():
    """The comparison of one output: a NaN at any one place, on either side or both, beside finite differences."""
    want = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    one_nan = want.copy()
    one_nan[1, 0] = np.nan
    assert _difference("logits", want + 1e-7, want, want) < 1e-5
    for got, expected in ((one_nan, want), (want, one_nan), (one_nan, one_nan)):
        assert math.isinf(_difference("logits", got, expected, want))
    # The classes Keras and the artifact rank first are scored by Keras' logits: a NaN logit is no agreement.
    classes = np.array([[1], [1]], np.int32)
    assert _difference("top_k_classes", classes, classes, want) == 0.0
    assert math.isinf(_difference("top_k_classes", classes, classes, np.array([[1.0, np.nan], [3.0, 4.0]])))
    # Infinities: equal ones agree, others do not.
    inf = np.array([[np.inf, 0.0]], np.float32)
    assert _difference("logits", inf, inf, inf) == 0.0
    assert math.isinf(_difference("logits", inf, np.zeros_like(inf), inf))
    assert math.isinf(_difference("logits", inf, -inf, inf))
    # Aggregated over batch sizes and outputs in any order, the failure stays visible.
    for by_batch in ({1: {"logits": math.inf, "probabilities": 0.0}, 4: {"logits": 0.0, "probabilities": 1e-8}},
                     {1: {"logits": 0.0, "probabilities": 1e-8}, 4: {"logits": math.inf, "probabilities": 0.0}}):
        report = ParityReport({"saved_model": by_batch}, {}, {})
        assert math.isinf(report["saved_model"]) and math.isinf(report.per_output["saved_model"]["logits"])


def _modes(root):
    """``{path relative to root: permission bits}`` of ``root`` and everything under it."""
    modes = {".": stat.S_IMODE(os.stat(root).st_mode)}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(folder, name)
            modes[os.path.relpath(full, root)] = stat.S_IMODE(os.lstat(full).st_mode)
    return modes


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask_022", "umask_027"])
def test_artifacts_get_the_permissions_the_umask_gives_new_files(tmp_path, umask):
    """Under umask 022 a server running as another user can read the SavedModel (every directory searchable, every
    file readable) and the ONNX file; under 027 others get nothing: the umask decides, as for any new file."""
    previous = os.umask(umask)
    try:
        model = _dense_classifier()
        version_dir = export.to_saved_model(model, str(tmp_path / "served"), task="classification", warmup=False)
        onnx_path = export.to_onnx(model, str(tmp_path / "model.onnx"), task="classification")
    finally:
        os.umask(previous)
    wrong = {}
    for relative, mode in _modes(version_dir).items():
        expected = (0o777 if os.path.isdir(os.path.join(version_dir, relative)) else 0o666) & ~umask
        if mode != expected:
            wrong[relative] = oct(mode)
    onnx_mode = stat.S_IMODE(os.stat(onnx_path).st_mode)
    if onnx_mode != 0o666 & ~umask:
        wrong[onnx_path] = oct(onnx_mode)
    assert not wrong, wrong
    if umask == 0o022:
        for relative, mode in _modes(version_dir).items():
            assert mode & 0o044 == 0o044, relative
            if os.path.isdir(os.path.join(version_dir, relative)):
                assert mode & 0o011 == 0o011, relative
        assert onnx_mode & 0o044 == 0o044
    assert stat.S_IMODE(os.stat(tmp_path / "served" / "models.config").st_mode) == 0o666 & ~umask
    assert sorted(os.listdir(tmp_path)) == ["model.onnx", "served"]
    assert sorted(os.listdir(tmp_path / "served")) == ["1", "models.config"]


def _mixed_precision_classifier(policy):
    """A three-feature, five-class classifier under ``policy`` with logits of a few units (float16 rounds them at
    ~1e-3, enough for a float16 softmax to miss 1e-5)."""
    keras.mixed_precision.set_dtype_policy(policy)
    inputs = keras.Input((3,), name="images")
    model = keras.Model(inputs, keras.layers.Dense(5, name="dense_head")(inputs))
    keras.mixed_precision.set_dtype_policy("float32")
    rng = np.random.default_rng(1)
    model.get_layer("dense_head").set_weights([rng.normal(size=(3, 5)).astype(np.float32) * 3,
                                               rng.normal(size=5).astype(np.float32)])
    return model


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_classifiers_verify_within_tolerance_with_float32_outputs(tmp_path, policy):
    """Half-precision logits are served as float32 and the softmax and top-k run on those: ``probabilities`` were a
    float16 softmax (3.6e-4 off), and a bfloat16 output crashed ``verify`` (NumPy has no bfloat16: ``|V2``)."""
    model = _mixed_precision_classifier(policy)
    x = np.random.default_rng(2).normal(size=(6, 3)).astype(np.float32)
    version_dir = export.to_saved_model(model, str(tmp_path / "served"), task="classification", warmup=False)
    report = export.verify(model, x, saved_model_dir=version_dir, task="classification", batch_sizes=(1, 6))
    assert report["saved_model"] <= 1e-5, report.table()
    outputs = report.signatures["saved_model"]["serving_default"]["outputs"]
    assert {name: dtype for name, (dtype, _) in outputs.items()} == {
        "logits": "float32", "probabilities": "float32", "top_k_classes": "int32", "top_k_scores": "float32"}


def test_verify_reads_a_saved_model_with_bfloat16_outputs(tmp_path):
    """A SavedModel that serves bfloat16 (written without :func:`export.to_saved_model`, which serves float32) is
    compared as float32, exactly, rather than failing in NumPy."""
    import tensorflow as tf

    model = _mixed_precision_classifier("mixed_bfloat16")
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serving_default", lambda images: {"output_0": model(images, training=False)},
                         input_signature=[tf.TensorSpec((None, 3), tf.float32, name="images")])
    archive.write_out(str(tmp_path / "bfloat16"), verbose=False)
    report = export.verify(model, X, saved_model_dir=str(tmp_path / "bfloat16"), task="generic")
    assert report.signatures["saved_model"]["serving_default"]["outputs"]["output_0"][0] == "bfloat16"
    assert report["saved_model"] == 0.0, report.table()
