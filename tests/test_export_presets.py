"""Every preset with packaged weights, exported and checked the way it is served (slow: ~40 s per preset).

The SavedModel, loaded in a process where otzoo cannot be imported (both signatures: float32 pixels and the raw
uint8 bytes), and the ONNX file in onnxruntime give the Keras model's outputs within 1e-5 (max abs, every named
output) on 64 real Fashion-MNIST test images given as raw uint8 pixels, at batch sizes 1 and 64.
"""
import os

import pytest

import export
import zoo
from otzoo.samples import sample_inputs
from zoo.loading import WEIGHTS_FILE, preset_dir
from zoo.registry import PRESETS

WITH_WEIGHTS = [n for n in zoo.list_models() if os.path.isfile(os.path.join(preset_dir(n), WEIGHTS_FILE))]


@pytest.mark.slow
@pytest.mark.fashion_mnist
@pytest.mark.parametrize("name", WITH_WEIGHTS)
def test_preset_exports_match_keras_on_real_images(name, tmp_path):
    model = zoo.load(name)
    spec = export.serving_spec(model)
    assert spec.task == zoo.model_card(name)["task"]
    classes = PRESETS[name].data.eval_classes if spec.task == "few_shot" else None
    inputs = sample_inputs(spec, 64, classes=classes)
    assert all(inputs[n].dtype.name == "uint8" for n in spec.pixel_inputs)
    assert len(inputs[spec.batched_inputs[0]]) == 64
    version_dir = export.to_saved_model(model, str(tmp_path / name))
    onnx_path = export.to_onnx(model, str(tmp_path / f"{name}.onnx"))
    report = export.verify(model, inputs, saved_model_dir=version_dir, onnx_path=onnx_path, batch_sizes=(1, 64))
    assert set(report) == {"saved_model", "saved_model_uint8", "onnx"}
    assert all(set(by_batch) == {1, 64} for by_batch in report.per_batch_size.values())
    assert max(report.values()) <= 1e-5, f"{name}:\n{report.table()}"
