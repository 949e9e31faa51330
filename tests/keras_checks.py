"""The Keras checks every layer of the zoo must pass, as reusable assertions.

``build_model`` is a zero-argument function returning a fresh, uncompiled ``keras.Model`` (it is called inside
strategy scopes and under dtype policies). ``x`` is an array or a list of arrays, ``y`` the targets for ``loss``.
"""
import os

import keras
import numpy as np
import tensorflow as tf

import export


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _outputs(model, x):
    out = model(x, training=False)
    return [np.asarray(o) for o in _as_list(out)]


def assert_save_load_roundtrip(model, x, tmp_path, atol=0.0):
    """A ``.keras`` round trip rebuilds the model from its config and reproduces the outputs."""
    path = os.path.join(str(tmp_path), "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    for a, b in zip(_outputs(model, x), _outputs(restored, x)):
        np.testing.assert_allclose(a, b, atol=atol, rtol=0)
    return restored


def assert_fits(build_model, x, y, loss, jit_compile=False, strategy=None, epochs=2, batch_size=8):
    """``model.fit`` runs, the loss is finite and decreases over a few epochs on a fixed tiny batch."""
    scope = strategy.scope() if strategy is not None else _null_scope()
    with scope:
        model = build_model()
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss, jit_compile=jit_compile)
    history = model.fit(x, y, epochs=epochs, batch_size=batch_size, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], f"loss did not decrease: {losses}"
    return model


def assert_fits_with_xla(build_model, x, y, loss, **kwargs):
    return assert_fits(build_model, x, y, loss, jit_compile=True, **kwargs)


_STRATEGIES = {}


def two_replica_strategy():
    """A 2-replica MirroredStrategy on the two logical CPUs, shared by the whole test process.

    Gradients are reduced through one device rather than collective ops: on logical CPU devices, the collective
    all-reduce of one model's training function reuses the instance keys of an earlier model's in the same
    process ("Shape mismatch in the collective instance 100"), which would make the tests depend on their order.
    """
    if "mirrored" not in _STRATEGIES:
        devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
        assert len(devices) == 2, "tests/conftest.py should have created two logical CPU devices"
        _STRATEGIES["mirrored"] = tf.distribute.MirroredStrategy(
            devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
    return _STRATEGIES["mirrored"]


def assert_fits_mirrored(build_model, x, y, loss, **kwargs):
    strategy = two_replica_strategy()
    assert strategy.num_replicas_in_sync == 2
    return assert_fits(build_model, x, y, loss, strategy=strategy, **kwargs)


def assert_mixed_precision(build_model, x, float32_model=None, atol=5e-2):
    """Under ``mixed_float16`` the model runs, its outputs are finite and close to the float32 model's."""
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = build_model()
        if float32_model is not None:
            model.set_weights(float32_model.get_weights())
        outputs = _outputs(model, x)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    for out in outputs:
        assert np.all(np.isfinite(out.astype(np.float32)))
    if float32_model is not None:
        for a, b in zip(outputs, _outputs(float32_model, x)):
            np.testing.assert_allclose(a.astype(np.float32), b, atol=atol, rtol=atol)
    return outputs


def assert_export_parity(model, x, tmp_path, atol=1e-5, onnx=True):
    """SavedModel (and ONNX) outputs, computed in a fresh process, equal Keras' within ``atol``."""
    saved_model_dir = export.to_saved_model(model, os.path.join(str(tmp_path), "saved_model"))
    onnx_path = export.to_onnx(model, os.path.join(str(tmp_path), "model.onnx")) if onnx else None
    report = export.verify(model, x, saved_model_dir=saved_model_dir, onnx_path=onnx_path)
    for kind, diff in report.items():
        assert diff <= atol, f"{kind} differs from Keras by {diff:.3g} > {atol}"
    return report


class _null_scope:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
