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
keras.distribution.set_distribution(None)
report.finish()
