"""SavedModel and ONNX export with parity checks run outside the exporting process.

``verify`` loads each artifact in a fresh Python process (SavedModel through ``tf.saved_model.load``, ONNX through
``onnxruntime``), feeds it the same inputs and reports the maximum absolute difference against the Keras model.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np


def _refuse_unexportable(model):
    """Raise with the reason of the first layer whose ``export_blocker`` property is set (docs/api.md)."""
    for layer in model._flatten_layers(include_self=False, recursive=True):
        reason = getattr(layer, "export_blocker", None)
        if reason:
            raise ValueError(f"Layer {layer.name!r} cannot be exported: {reason}")


def to_saved_model(model, directory):
    """Write a TF Serving SavedModel (signatures ``serve`` and ``serving_default``) to ``directory``."""
    _refuse_unexportable(model)
    model.export(directory, format="tf_saved_model", verbose=False)
    return directory


def to_onnx(model, path):
    """Write an ONNX model (through tf2onnx) to ``path``."""
    _refuse_unexportable(model)
    model.export(path, format="onnx", verbose=False)
    return path


_RUNNER = r"""
import json, sys, numpy as np
kind, artifact, inputs_path, outputs_path = sys.argv[1:5]
inputs = dict(np.load(inputs_path))
names = sorted(inputs, key=lambda k: int(k.split("_")[1]))
arrays = [inputs[k] for k in names]
if kind == "saved_model":
    import tensorflow as tf
    loaded = tf.saved_model.load(artifact)
    try:
        out = loaded.serve(*arrays)
    except (TypeError, ValueError):  # a model called on a list of inputs exports one list argument
        out = loaded.serve(arrays)
    out = out if isinstance(out, (list, tuple)) else [out]
    out = [np.asarray(o) for o in out]
else:
    import onnxruntime as ort
    session = ort.InferenceSession(artifact, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), arrays)}
    out = session.run(None, feed)
np.savez(outputs_path, *out)
"""


def _run_fresh(kind, artifact, arrays):
    with tempfile.TemporaryDirectory() as tmp:
        inputs_path = os.path.join(tmp, "inputs.npz")
        outputs_path = os.path.join(tmp, "outputs.npz")
        np.savez(inputs_path, **{f"input_{i}": a for i, a in enumerate(arrays)})
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run(
            [sys.executable, "-c", _RUNNER, kind, artifact, inputs_path, outputs_path],
            capture_output=True, text=True, env=env,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"Running the {kind} artifact in a fresh process failed:\n{proc.stderr[-3000:]}")
        with np.load(outputs_path) as data:
            return [data[f"arr_{i}"] for i in range(len(data.files))]


def verify(model, inputs, saved_model_dir=None, onnx_path=None):
    """Max abs difference between Keras and each given artifact, each run in a fresh Python process.

    ``inputs``: an array or a list of arrays in the model's input order. Returns a dict
    ``{"saved_model": diff, "onnx": diff}`` with only the artifacts given.
    """
    arrays = [np.asarray(a) for a in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
    expected = model(arrays if len(arrays) > 1 else arrays[0], training=False)
    expected = [np.asarray(e) for e in (expected if isinstance(expected, (list, tuple)) else [expected])]
    report = {}
    for kind, artifact in (("saved_model", saved_model_dir), ("onnx", onnx_path)):
        if artifact is None:
            continue
        got = _run_fresh(kind, artifact, arrays)
        if len(got) != len(expected):
            raise AssertionError(f"{kind}: {len(got)} outputs, Keras has {len(expected)}.")
        report[kind] = max(float(np.max(np.abs(g.astype(np.float64) - e.astype(np.float64))))
                           for g, e in zip(got, expected))
    return report

