"""What a user gets from installing otzoo's wheel (the core install, no extra), run by scripts/check_wheel.sh in a fresh
virtual environment from a directory outside the checkout:

- every public layer of ``ot_layers.layers`` builds in a small model and fits one step on random data, and the
  model's ``.keras`` save/load round trip gives the same outputs;
- ``zoo.load`` of every preset (``zoo.list_models()``) predicts on a small batch (the packaged weights);
- the project's packages are the installed ones (not a checkout), and no extra's package is installed.

It runs on the Keras backend ``KERAS_BACKEND`` names: check_wheel.sh runs it on TensorFlow (the core install) and on
JAX in an environment without TensorFlow (the wheel installed without its dependencies beside Keras, NumPy, SciPy,
POT and JAX), where ``--without-tensorflow`` also checks that TensorFlow is not installed.

Prints one line per check and ``core install on BACKEND: all N checks hold``; an assertion error ends it (exit
status 1).
"""
import importlib.util
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import ot_layers
import otzoo
import zoo
from ot_layers.layers import (ClassProxies, EMDHead, GeneralizedSumPooling, HypersphericalPrototypes,
                              ManifoldProxies, MultiProxyWasserstein, PatchExtractor, SinkhornMatch, StructuredFC)

B, D, K = 4, 8, 3  # batch, feature dimension, classes
EXTRA_MODULES = ("tf2onnx", "onnx", "onnxruntime", "tensorflow_serving", "matplotlib", "keras_tuner",
                 "tensorflow_datasets", "tensorboard", "sklearn")


@keras.saving.register_keras_serializable(package="check_core_install")
class Trainable(keras.layers.Layer):
    """A trainable tensor of a fixed shape, whatever the input: the class targets or support set that a two-input
    layer compares the batch with."""

    def __init__(self, shape, **kwargs):
        super().__init__(**kwargs)
        self.value_shape = tuple(shape)

    def build(self, input_shape):
        self.value = self.add_weight(shape=self.value_shape, initializer="random_normal", name="value")

    def call(self, inputs):
        return keras.ops.convert_to_tensor(self.value)

    def compute_output_shape(self, input_shape):
        return self.value_shape

    def get_config(self):
        return {**super().get_config(), "shape": list(self.value_shape)}


def _map_features(inputs):
    """Feature maps ``(B, 3, 3, D)`` from ``(B, 6, 6, 1)`` images: a trainable layer before the one checked."""
    return keras.layers.Conv2D(D, 2, strides=2, name="features")(inputs)


def _vector_features(inputs):
    return keras.layers.Dense(D, name="features")(keras.layers.Flatten()(inputs))


# name -> (image input shape, build(inputs) -> output tensor(s) of the layer)
CASES = {
    "SinkhornMatch": ((6, 6, 1), lambda x: SinkhornMatch(max_iter=20)(
        [_map_features(x), Trainable((K, 2, D), name="targets")(x)])),
    "MultiProxyWasserstein": ((6, 6, 1), lambda x: MultiProxyWasserstein(K, num_proxies=2, max_iter=20)(
        _map_features(x))),
    "ClassProxies": ((6, 6, 1), lambda x: ClassProxies(K, num_proxies=2)(_vector_features(x))),
    "GeneralizedSumPooling": ((6, 6, 1), lambda x: GeneralizedSumPooling(num_prototypes=4, max_iter=20)(
        _map_features(x))),
    "EMDHead": ((6, 6, 1), lambda x: EMDHead(method="sinkhorn", max_iter=20)(
        [_map_features(x), Trainable((K, 2, 2, D), name="support")(x)])),
    "StructuredFC": ((6, 6, 1), lambda x: StructuredFC(K, num_nodes=4, head=dict(method="sinkhorn", max_iter=20))(
        _map_features(x))),
    "PatchExtractor": ((8, 8, 1), lambda x: keras.layers.Dense(2)(PatchExtractor("grid", grid=2, patch_size=4)(x))),
    "HypersphericalPrototypes": ((6, 6, 1), lambda x: HypersphericalPrototypes(K, D)(_vector_features(x))),
    "ManifoldProxies": ((6, 6, 1), lambda x: ManifoldProxies(K, D)(_vector_features(x))),
}


def _flat(outputs):
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _outputs(model, x):
    return [np.asarray(keras.ops.convert_to_numpy(o)) for o in _flat(model(x, training=False))]


def check_layer(name, folder):
    """A model ``images -> trainable features -> layer -> Dense(1)``: one ``fit`` step, then a ``.keras`` round
    trip reproducing the outputs."""
    shape, build = CASES[name]
    inputs = keras.Input(shape, name="images")
    outputs = [keras.layers.Dense(1)(keras.layers.Flatten()(o)) for o in _flat(build(inputs))]
    output = outputs[0] if len(outputs) == 1 else keras.layers.Add()(outputs)
    model = keras.Model(inputs, output, name=f"check_{name}")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B,) + shape).astype("float32")
    y = rng.normal(size=(B, 1)).astype("float32")
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    history = model.fit(x, y, epochs=1, batch_size=B, verbose=0)
    loss = history.history["loss"][-1]
    assert np.isfinite(loss), f"{name}: loss {loss}"
    path = os.path.join(folder, f"{name}.keras")
    model.save(path)
    restored = keras.saving.load_model(path)
    for got, want in zip(_outputs(restored, x), _outputs(model, x)):
        assert np.isfinite(want).all(), f"{name}: non-finite outputs"
        np.testing.assert_allclose(got, want, atol=1e-6, rtol=0, err_msg=f"{name}: .keras round trip")
    return f"{name}: fit one step (loss {loss:.4f}); .keras round trip equal"


def check_preset(name):
    """``zoo.load(name)`` (packaged weights) predicts finite outputs for 4 images (few-shot: 4 queries against one
    support image per class)."""
    model = zoo.load(name)
    rng = np.random.default_rng(0)
    shape = tuple(model.inputs[0].shape[1:])
    query = rng.integers(0, 256, size=(4,) + shape).astype("float32")
    if len(model.inputs) == 3:  # few-shot: [query, support, support_labels]
        ways = int(model.outputs[0].shape[-1])
        support = rng.integers(0, 256, size=(ways,) + shape).astype("float32")
        output = keras.ops.convert_to_numpy(model([query, support, np.arange(ways, dtype="int32")], training=False))
    else:
        output = model.predict(query, verbose=0)
    assert output.shape[0] == 4 and np.isfinite(output).all(), f"{name}: outputs {output.shape}"
    return f"zoo.load({name!r}): predicts {output.shape}"


def main(argv=None):
    without_tensorflow = "--without-tensorflow" in (sys.argv[1:] if argv is None else argv)
    start = time.time()
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")  # one model per check: retracing warnings are expected
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    lines = []
    for package in (ot_layers, zoo, otzoo):  # the installed wheel, not the checkout
        location = os.path.dirname(os.path.abspath(package.__file__))
        assert "site-packages" in location and not location.startswith(checkout + os.sep), location
    lines.append(f"otzoo imported from {os.path.dirname(os.path.dirname(ot_layers.__file__))}")
    present = [m for m in EXTRA_MODULES if importlib.util.find_spec(m) is not None]
    assert not present, f"the core install holds extras' packages: {present}"
    lines.append(f"core only: none of {', '.join(EXTRA_MODULES)} installed")
    if without_tensorflow:
        assert importlib.util.find_spec("tensorflow") is None, "TensorFlow is installed"
        assert backend != "tensorflow", "Keras runs on TensorFlow"
        lines.append("TensorFlow not installed")
    lines.append(f"Keras backend: {backend}")
    print("\n".join(lines), flush=True)
    public = set(ot_layers.layers.__all__)
    assert public == set(CASES), f"public layers without a check: {sorted(public - set(CASES))}; " \
                                 f"checks of no public layer: {sorted(set(CASES) - public)}"
    with tempfile.TemporaryDirectory(prefix="otzoo-core-") as folder:
        for name in sorted(CASES):
            lines.append(check_layer(name, folder))
            print(lines[-1], flush=True)
    presets = zoo.list_models()
    assert presets, "zoo.list_models() is empty"
    for name in presets:
        lines.append(check_preset(name))
        print(lines[-1], flush=True)
    print(f"core install on {backend}: all {len(lines)} checks hold ({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
