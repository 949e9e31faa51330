"""Data-parallel training of the MPW head through ``keras.distribution`` on JAX, on two host CPU devices.

Two epochs of ``model.fit`` with ``keras.distribution.DataParallel`` over two devices give the weights of the same
epochs on one device (the same global batches; the batch is split across the devices and the gradients averaged),
within float32 round-off. On TensorFlow and PyTorch the script reports the check as not applicable: multi-device
training there is TensorFlow's ``tf.distribute`` (tests/test_distributed*.py).

    XLA_FLAGS=--xla_force_host_platform_device_count=2 KERAS_BACKEND=jax python tests/backends/check_data_parallel.py
"""
import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()

import keras  # noqa: E402
import numpy as np  # noqa: E402

from backend_tools import BACKEND, Report  # noqa: E402
from ot_layers import MultiProxyWasserstein  # noqa: E402

report = Report("data_parallel")
if BACKEND != "jax":
    report.record["not_applicable"] = "keras.distribution data parallelism is checked on JAX"
    report.finish()

import jax  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 4, 4, 8)).astype(np.float32)
y = rng.integers(0, 5, size=64)


def trained(distribution):
    keras.distribution.set_distribution(distribution)
    try:
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4, 4, 8))
        outputs = MultiProxyWasserstein(5, num_proxies=2)(keras.layers.Conv2D(8, 1)(inputs))
        model = keras.Model(inputs, outputs)
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, epochs=2, batch_size=16, shuffle=False, verbose=0)
        return [np.asarray(w) for w in model.get_weights()], history.history["loss"]
    finally:
        keras.distribution.set_distribution(None)


devices = jax.devices("cpu")
report.measure("devices", len(devices))
report.expect("two_devices", len(devices) >= 2)
# Both on host CPU devices, also where an accelerator is the default device (a GPU machine has one GPU): one device
# against two, the same code path.
single, single_loss = trained(keras.distribution.DataParallel(devices=devices[:1]))
parallel, parallel_loss = trained(keras.distribution.DataParallel(devices=devices[:2]))
report.measure("weights_max_difference", max(np.abs(a - b).max() for a, b in zip(single, parallel)), 1e-5)
report.measure("loss_single_last", single_loss[-1])
report.measure("loss_parallel_last", parallel_loss[-1])
report.expect("parallel_loss_decreases", parallel_loss[-1] < parallel_loss[0])

# Batches that do not split over the two devices are named before training (JAX refused them deep inside fit): a
# training batch of 15, and a last validation batch of 5 (21 = 16 + 5) after an epoch of training.
from training.data.arrays import ArrayBatches  # noqa: E402
from training.distributed.fit import fit  # noqa: E402
from training.distributed.keras_distribution import UnevenSplitError  # noqa: E402

keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices[:2]))
inputs = keras.Input((4, 4, 8))
model = keras.Model(inputs, MultiProxyWasserstein(5, num_proxies=2)(keras.layers.Conv2D(8, 1)(inputs)))
model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
for name, train, validation in (("data", ArrayBatches(x, y, 15, training=True, pad=0), None),
                                ("validation_data", ArrayBatches(x, y, 16, training=True, pad=0),
                                 ArrayBatches(x[:21], y[:21], 16))):
    try:
        fit(model, train, epochs=1, validation_data=validation, verbose=0)
        report.expect(f"uneven_{name}_refused", False)
    except UnevenSplitError as error:
        report.expect(f"uneven_{name}_refused", str(error).startswith(f"`{name}`: a batch of"))
_, history = fit(model, ArrayBatches(x, y, 16, training=True, pad=0), epochs=1,
                 validation_data=ArrayBatches(x[:20], y[:20], 4), verbose=0)
report.expect("even_batches_train", np.isfinite(history.history["val_loss"][-1]))

# tf.data datasets (a TFDS pipeline, where TensorFlow is installed beside JAX) are checked the same way, before any
# step: a last batch of 5 (21 = 16 + 5) read in one pass, a static batch of 15 at once; with steps, the batches fit
# reads (Keras keeps one validation iterator across epochs: one validation step an epoch for two epochs reads the
# batch of 5 in the second).
try:
    import tensorflow as tf  # noqa: E402
except ImportError:
    tf = None
if tf is None:
    report.record["tf_data_skipped"] = "TensorFlow is not installed"
else:
    def tf_batches(count, batch_size, drop_remainder=False):
        return tf.data.Dataset.from_tensor_slices((x[:count], y[:count])).batch(batch_size, drop_remainder)

    def steps_done():
        return int(keras.ops.convert_to_numpy(model.optimizer.iterations))

    for key, name, size, kwargs in (
            ("tf_data", "data", 5, dict(data=tf_batches(21, 16))),
            ("tf_data_static", "data", 15, dict(data=tf_batches(64, 15, drop_remainder=True))),
            ("tf_data_steps", "data", 5, dict(data=tf_batches(21, 16).repeat(), steps_per_epoch=2)),
            ("tf_validation_data", "validation_data", 5, dict(data=tf_batches(64, 16),
                                                              validation_data=tf_batches(21, 16))),
            ("tf_validation_steps", "validation_data", 5, dict(data=tf_batches(64, 16), epochs=2,
                                                               validation_data=tf_batches(21, 16),
                                                               validation_steps=1))):
        kwargs.setdefault("epochs", 1)
        weights, steps_before = model.get_weights(), steps_done()
        try:
            fit(model, kwargs.pop("data"), verbose=0, **kwargs)
            report.expect(f"uneven_{key}_refused", False, "fit trained")
        except UnevenSplitError as error:
            report.expect(f"uneven_{key}_refused", str(error).startswith(
                f"`{name}`: a batch of {size} examples does not split over the 2 devices") and "\n" not in str(error),
                str(error))
        except Exception as error:  # noqa: BLE001 - JAX's own error, deep inside fit: the check missed the batch
            report.expect(f"uneven_{key}_refused", False, f"{type(error).__name__}: {str(error)[:200]}")
        untouched = steps_done() == steps_before and all(np.array_equal(a, b)
                                                          for a, b in zip(weights, model.get_weights()))
        report.expect(f"uneven_{key}_untrained", untouched)
        model.set_weights(weights)  # a missed batch may have let an epoch train
    # Even batches train: batches of 16 and 6, endless with steps, and one validation step an epoch; one validation
    # step of one epoch stops before the odd batch.
    _, history = fit(model, tf_batches(22, 16).repeat(), epochs=2, steps_per_epoch=2,
                     validation_data=tf_batches(22, 16), validation_steps=1, verbose=0)
    report.expect("even_tf_data_trains", np.isfinite(history.history["val_loss"][-1]))
    _, history = fit(model, tf_batches(64, 16, drop_remainder=True), epochs=1, validation_data=tf_batches(21, 16),
                     validation_steps=1, verbose=0)
    report.expect("tf_validation_steps_before_odd_batch_train", np.isfinite(history.history["val_loss"][-1]))
keras.distribution.set_distribution(None)
report.finish()
