"""``model.predict`` on several replicas with a last batch smaller than them (``ot_layers.padded_predict``).

Under a 2-replica ``MirroredStrategy`` (the two logical CPUs of ``conftest.py``) a last batch of one example leaves a
replica an empty batch. Where TensorFlow runs oneDNN (by default on some x86 CPUs, or with
``TF_ENABLE_ONEDNN_OPTS=1``) the convolution then fails: ``InvalidArgumentError: ... input depth must be evenly
divisible by filter depth: 1 vs 8`` at ``replica_1/.../conv1/Relu``, inside ``predict``, so ``CCPReinitialization``
(with an ``embedding_model``) and ``HardProxyUpdate`` failed after or before an epoch of training. Where oneDNN is
off an empty batch passes silently, so the in-process tests put a :class:`NoEmptyBatch` layer in the models, which
fails on an empty batch on every machine; one subprocess runs the real convolution with oneDNN on. JAX's
``DataParallel`` refuses a batch its devices do not divide (``IndivisibleError``): one subprocess on two host
devices.

The outputs must be those of a one-device ``predict`` (the padding rows' outputs dropped), and on one replica
``predict_padded`` is ``model.predict`` itself (bit-identical).
"""
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import distributed_models as dm
from ot_layers import ClassProxies, ManifoldProxies
from ot_layers.callbacks import CCPReinitialization, HardProxyUpdate
from ot_layers.losses import ManifoldProxyLoss, ProxyAnchorLoss
from ot_layers.padded_predict import drop_padding, pad_rows, predict_padded, replica_count
from training.data.pipelines import array_batches, predict_batches
from training.recipes.classification import classification_accuracy
from training.recipes.common import preset_spec
from training.recipes.retrieval import embed
from training.tuning.trial import trial_score

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGES, LABELS = dm.synthetic_data(64)
IMAGES = IMAGES / 255.0  # embeddings of order 1, whose float32 rounding stays below the tolerance of 1e-6


class NoEmptyBatch(keras.layers.Layer):
    """Passes its input through; fails on an empty batch, as oneDNN's CPU convolution does (on every machine:
    without oneDNN TensorFlow's convolution takes an empty batch)."""

    def call(self, x):
        tf.debugging.assert_positive(tf.shape(x)[0], message="a replica got an empty batch")
        return x


def _embedding_model():
    """Images -> 4-d embeddings through ``dm.plain_backbone`` behind :class:`NoEmptyBatch`."""
    inputs = keras.Input(dm.IMAGE_SHAPE)
    features = dm.plain_backbone()(NoEmptyBatch()(inputs))
    return keras.Model(inputs, keras.layers.Dense(4, name="embed")(keras.layers.GlobalAveragePooling2D()(features)))


def _mirrored():
    from keras_checks import two_replica_strategy
    strategy = two_replica_strategy()
    assert strategy.num_replicas_in_sync == 2
    return strategy


def _models():
    """The same embedding model built on one device and under the 2-replica strategy (same weights)."""
    keras.utils.set_random_seed(0)
    single = _embedding_model()
    with _mirrored().scope():
        mirrored = _embedding_model()
    mirrored.set_weights(single.get_weights())
    return single, mirrored


@pytest.mark.parametrize("count, batch_size", [(33, 16), (1, 16), (17, 16), (35, 3)])
def test_predict_with_a_batch_smaller_than_the_replicas_equals_the_one_device_predict(count, batch_size):
    """33 in 16s and 17 in 16s end with a batch of 1; 1 image is a batch of 1; batches of 3 (rounded up to 4)
    end with one of 3 (35 = 8 x 4 + 3). Before: ``model.predict`` failed in ``NoEmptyBatch`` on replica 1."""
    single, mirrored = _models()
    assert replica_count(mirrored) == 2 and replica_count(single) == 1
    expected = single.predict(IMAGES[:count], batch_size=batch_size, verbose=0)
    found = predict_padded(mirrored, IMAGES[:count], batch_size)
    assert found.shape == expected.shape == (count, 4)
    np.testing.assert_allclose(found, expected, rtol=0, atol=1e-6)


def test_on_one_replica_predict_padded_is_model_predict():
    single, _ = _models()
    expected = single.predict(IMAGES[:33], batch_size=16, verbose=0)
    np.testing.assert_array_equal(predict_padded(single, IMAGES[:33], 16), expected)


def test_a_model_made_outside_the_scope_counts_the_current_strategys_replicas():
    """A model made outside a strategy's scope (``layer_input_model`` in a callback) predicts on the strategy
    current when it is called, and so counts its replicas."""
    single, _ = _models()
    assert replica_count(single) == 1
    with _mirrored().scope():
        assert replica_count(single) == 2
        found = predict_padded(single, IMAGES[:17], 16)
    np.testing.assert_allclose(found, single.predict(IMAGES[:17], batch_size=16, verbose=0), rtol=0, atol=1e-6)


def test_padding_rows_of_structures_are_dropped():
    x = {"a": np.arange(5.0)[:, None], "b": np.arange(10.0).reshape(5, 2)}
    padded = pad_rows(x, 4)
    assert len(padded["a"]) == 8 and np.all(padded["a"][5:] == 4.0) and np.all(padded["b"][5:] == [8.0, 9.0])
    assert pad_rows(x, 5) is x
    outputs = [np.arange(12.0), np.arange(12.0) * 2]  # batches of 3 and 5 rows, padded to 4 and 8 rows
    kept = drop_padding(outputs, [3, 5], 4)
    np.testing.assert_array_equal(kept[0], [0, 1, 2, 4, 5, 6, 7, 8])
    np.testing.assert_array_equal(kept[1], 2 * kept[0])
    with pytest.raises(ValueError, match="`outputs` has 11 rows"):
        drop_padding(np.arange(11.0), [3, 5], 4)


def test_the_recipes_predict_a_pipeline_with_a_last_batch_of_one_on_two_replicas():
    """``classification_accuracy``, retrieval's ``embed`` and ``trial_score`` read ``tf.data`` pipelines whose last
    batch may be smaller than the replicas (33 test images in batches of 16); before, their ``model.predict``
    failed. On one replica the path is ``model.predict`` over the pipeline as before (bit-identical)."""
    single, mirrored = _models()
    batches = array_batches(IMAGES[:33], LABELS[:33], 16)
    expected = single.predict(batches.map(lambda x, y: x), verbose=0)
    outputs, labels = embed(mirrored, batches)
    np.testing.assert_allclose(outputs, expected, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(labels, LABELS[:33])
    one_replica, _ = predict_batches(single, batches)
    np.testing.assert_array_equal(one_replica, expected)

    keras.utils.set_random_seed(0)
    single = dm.mpw_classifier()
    with _mirrored().scope():
        mirrored = keras.Sequential([NoEmptyBatch(), dm.mpw_classifier()])
    mirrored.set_weights(single.get_weights())
    accuracy = classification_accuracy(single, IMAGES[:33], LABELS[:33], batch_size=16)
    assert classification_accuracy(mirrored, IMAGES[:33], LABELS[:33], batch_size=16) == accuracy
    spec = preset_spec("resnet20_mpw_fashion_mnist")  # a classification task: accuracy over batches of 256
    many, many_labels = dm.synthetic_data(257)
    assert trial_score(spec, mirrored, (many, many_labels)) == trial_score(spec, single, (many, many_labels))


def _proxy_model(head):
    """The embedding model with a proxy head on top, compiled; ``head``: ``ClassProxies`` or ``ManifoldProxies``."""
    embedding = _embedding_model()
    model = keras.Model(embedding.inputs, head(embedding.output))
    model.compile(keras.optimizers.SGD(0.05), ProxyAnchorLoss() if isinstance(head, ClassProxies)
                  else ManifoldProxyLoss())
    return model, embedding


def test_ccp_and_hard_proxies_embed_under_the_strategy_with_a_last_batch_of_one():
    """Both callbacks embed with ``predict`` through an ``embedding_model`` built under the strategy: CCP a pool of
    9 images per class in batches of 8 at its re-initialization (after epoch 1), the hard proxies 2 anchors and
    2 x 8 members in batches of 17 before every epoch. Before, the first failed after an epoch of training and the
    second before its first epoch."""
    data = tf.data.Dataset.from_tensor_slices((IMAGES, LABELS)).batch(16, drop_remainder=True)
    keras.utils.set_random_seed(0)
    with _mirrored().scope():
        model, embedding = _proxy_model(ClassProxies(dm.NUM_CLASSES, num_proxies=2, name="proxies"))
    scores = iter([0.5, 0.4])
    ccp = CCPReinitialization(IMAGES, LABELS, lambda: next(scores), embedding_model=embedding, patience=1,
                              pool_size=9, batch_size=8)
    history = model.fit(data, epochs=2, callbacks=[ccp], verbose=0, shuffle=False)
    assert ccp.reinitializations == 1 and np.all(np.isfinite(history.history["loss"]))

    meta_labels = LABELS % 2
    keras.utils.set_random_seed(0)
    with _mirrored().scope():
        model, embedding = _proxy_model(ManifoldProxies(2, 4, name="head"))
    hard = HardProxyUpdate(embedding, IMAGES, meta_labels, samples_per_meta_class=8, batch_size=17, max_iter=5)
    assert len(np.concatenate([hard.anchors, *hard.members])) % 17 == 1
    seen = []  # at each epoch start, right after the update: the layer's proxies and the callback's estimate
    record = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: seen.append(
        (np.asarray(model.get_layer("head").proxies), hard.compute_proxies())))
    history = model.fit(data.map(lambda x, y: (x, y % 2)), epochs=2, callbacks=[hard, record], verbose=0,
                        shuffle=False)
    assert np.all(np.isfinite(history.history["loss"])) and len(seen) == 2
    for proxies, expected in seen:
        np.testing.assert_allclose(proxies, expected, atol=1e-6)


def _run(code, *path, **environment):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, *path]), TF_CPP_MIN_LOG_LEVEL="3", **environment)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


ONEDNN = """
import tensorflow as tf
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)
import json, keras, numpy as np
from ot_layers.padded_predict import predict_padded

def build():  # two convolutions: the second fails on the first one's unchanged empty input
    keras.utils.set_random_seed(0)
    inputs = keras.Input((12, 12, 1))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inputs)
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D()(x))

single = build()
with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    model = build()
images = np.random.default_rng(0).uniform(size=(33, 12, 12, 1)).astype("float32")
expected = single.predict(images, batch_size=16, verbose=0)
try:
    model.predict(images, batch_size=16, verbose=0)
    plain = "ran"
except tf.errors.InvalidArgumentError as error:
    plain = str(error)
found = predict_padded(model, images, 16)
print(json.dumps({"plain": plain, "difference": float(np.abs(found - expected).max())}))
"""


def test_with_onednn_on_the_convolution_of_an_empty_replica_batch_is_avoided():
    """The real failure: oneDNN's convolution on replica 1's empty batch (``model.predict`` itself still fails,
    where oneDNN runs the convolution; ``predict_padded`` does not)."""
    result = _run(ONEDNN, KERAS_BACKEND="tensorflow", TF_ENABLE_ONEDNN_OPTS="1")  # before: "plain" failed here
    assert result["plain"] == "ran" or "input depth must be evenly divisible by filter depth" in result["plain"]
    assert result["difference"] <= 1e-6


JAX_DATA_PARALLEL = """
import json, sys, keras, numpy as np
from ot_layers import ManifoldProxies
from ot_layers.callbacks import HardProxyUpdate
from ot_layers.losses import ManifoldProxyLoss
from ot_layers.padded_predict import predict_padded, replica_count
from training.data.arrays import ArrayBatches
from training.data.pipelines import predict_batches

def build():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6, 1, 1))
    embedding = keras.Model(inputs, keras.layers.Dense(4)(keras.layers.Flatten()(inputs)))
    model = keras.Model(inputs, ManifoldProxies(2, 4, name="head")(embedding.output))
    model.compile(keras.optimizers.SGD(0.05), ManifoldProxyLoss())
    return model, embedding

labels = np.arange(64) % 2
images = (np.random.default_rng(0).normal(size=(64, 6, 1, 1)) + labels[:, None, None, None]).astype("float32")
_, single = build()
expected = single.predict(images[:33], batch_size=16, verbose=0)
keras.distribution.set_distribution(keras.distribution.DataParallel(devices=keras.distribution.list_devices()))
model, embedding = build()
found = predict_padded(embedding, images[:33], 16)
batches, _ = predict_batches(embedding, ArrayBatches(images[:33], labels[:33], 16))
hard = HardProxyUpdate(embedding, images, labels, samples_per_meta_class=8, batch_size=17, max_iter=5)
history = model.fit(images, labels, batch_size=16, epochs=1, callbacks=[hard], verbose=0)
try:  # last: a failed predict leaves the model unusable (its variables' values are gone)
    embedding.predict(images[:33], batch_size=16, verbose=0)
    plain = "ran"
except Exception as error:
    plain = type(error).__name__
print(json.dumps({"replicas": replica_count(embedding), "plain": plain, "tensorflow": "tensorflow" in sys.modules,
                  "difference": float(np.abs(found - expected).max()),
                  "pipeline_difference": float(np.abs(batches - expected).max()),
                  "loss": history.history["loss"][-1]}))
"""


def test_on_jax_data_parallel_a_batch_the_devices_do_not_divide_is_padded():
    """JAX on two host devices under ``keras.distribution.DataParallel``, TensorFlow blocked (as on the GPU
    machines): ``predict`` refuses a last batch of one (``IndivisibleError``); the helper, a pipeline of
    ``ArrayBatches`` and ``HardProxyUpdate`` pad it, without importing TensorFlow."""
    pytest.importorskip("jax")
    result = _run(JAX_DATA_PARALLEL, os.path.join(ROOT, "tests", "backends", "without_tensorflow_site"),
                  KERAS_BACKEND="jax",
                  XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip())
    assert result["replicas"] == 2 and result["plain"] != "ran" and not result["tensorflow"]  # IndivisibleError
    assert result["difference"] <= 1e-5 and result["pipeline_difference"] <= 1e-5
    assert np.isfinite(result["loss"])
