"""How a run spreads over the devices on Keras' JAX and PyTorch backends, where ``tf.distribute`` does not exist.

``otzoo train --strategy`` names a ``tf.distribute`` strategy on TensorFlow (``training.distributed.strategies``). On
JAX and PyTorch, :func:`keras_distribution` turns the two names that carry over into a :class:`KerasDistribution`,
the counterpart a recipe builds, trains and describes a run with (``scope()``, ``num_replicas_in_sync``):

- ``"auto"``: on JAX with two or more devices, ``keras.distribution.DataParallel`` over all of them (each device
  holds the weights and takes an equal share of every batch; the gradients are averaged), set for the whole process
  with ``keras.distribution.set_distribution``; else one device (PyTorch: the first GPU when there is one, as Keras
  places it);
- ``"one_device"``: one device.

``mirrored``, ``multi_worker`` and ``tpu`` are TensorFlow strategies and raise a ``ValueError`` naming ``strategy``.
"""
import contextlib
import os
import platform

import keras

from ot_layers.backends import accelerator_names
from ot_layers.padded_predict import batch_devices

KERAS_STRATEGIES = ("auto", "one_device")


class UnevenSplitError(ValueError):
    """A batch that ``keras.distribution.DataParallel`` cannot split evenly over its devices (``otzoo`` prints it in
    one line)."""


class KerasDistribution:
    """A run's device layout on JAX or PyTorch: ``name`` (``"data_parallel"``, ``"one_device"`` or ``"default"``)
    and the ``keras.distribution`` object (``None`` on one device)."""

    def __init__(self, name, distribution=None):
        self.name, self.distribution = name, distribution

    @property
    def num_replicas_in_sync(self):
        """The devices that share every batch (1 without data parallelism)."""
        return batch_devices(self.distribution)

    def scope(self):
        """The scope to build the model in (the distribution is already the process's; nothing more to enter)."""
        return contextlib.nullcontext()

    def __repr__(self):
        return f"KerasDistribution({self.name!r}, {self.num_replicas_in_sync} device(s))"


def keras_distribution(name="auto"):
    """The :class:`KerasDistribution` of strategy ``name`` on the active (JAX or PyTorch) backend; see the module
    docstring. A TensorFlow strategy's name raises ``ValueError`` naming ``strategy``."""
    if isinstance(name, KerasDistribution):
        return name
    backend = keras.backend.backend()
    if name not in KERAS_STRATEGIES:
        raise ValueError(f"`strategy`: {name!r} is a tf.distribute strategy of the TensorFlow backend; on {backend} "
                         f"use one of {list(KERAS_STRATEGIES)} ('auto' spreads each batch over all devices with "
                         "keras.distribution.DataParallel on JAX).")
    if name == "auto" and backend == "jax":
        devices = keras.distribution.list_devices()
        if len(devices) > 1:
            distribution = keras.distribution.DataParallel(devices=devices)
            keras.distribution.set_distribution(distribution)
            return KerasDistribution("data_parallel", distribution)
    return KerasDistribution("one_device" if name == "one_device" else "default")


def describe_distribution(distribution):
    """The card's ``strategy`` line for a :class:`KerasDistribution`."""
    return (f"keras.distribution ({distribution.name}, {distribution.num_replicas_in_sync} device(s), "
            f"{keras.backend.backend()} backend)")


def hardware_description():
    """The card's ``hardware``: the CPU and the accelerators of the active backend."""
    return f"{platform.machine()} CPU x{os.cpu_count()}" + "".join(f", {name}" for name in accelerator_names())
