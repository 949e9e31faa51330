"""``model.fit`` stopped after an epoch's backup (``AtomicBackupAndRestore``) and resumed in a fresh model ends with
the weights of an uninterrupted run on the active Keras backend, with ``Dropout`` seeded and unseeded. Unseeded, the
masks come from a ``keras.random.SeedGenerator`` on TensorFlow and JAX but from torch's global generator on PyTorch,
so there the backup must carry torch's generator state: the check also resumes from a backup with that state
removed and expects the weights to differ (the state matters, and the check can fail).

Between the interruption and the resume the global seeds are set anew, as in a new process.

    KERAS_BACKEND=torch python tests/backends/check_resume.py
"""
import os
import tempfile

import keras
import numpy as np

from backend_tools import Report
from training.distributed.checkpoints import METADATA_FILE, TORCH_RNG_FILE, AtomicBackupAndRestore, read_pointer

report = Report("resume")
rng = np.random.default_rng(0)
features = rng.normal(size=(64, 10)).astype("float32")
labels = (np.arange(64) % 3).astype("int32")
EPOCHS, STOP_AFTER = 4, 1  # interrupted at the end of epoch 1 (0-based), after its backup


class Interrupt(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch == STOP_AFTER:
            raise RuntimeError("interrupted")


def classifier(dropout_seed):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.5, seed=dropout_seed), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def fit(model, callbacks):
    model.fit(features, labels, epochs=EPOCHS, batch_size=16, shuffle=False, verbose=0, callbacks=callbacks)
    return model.get_weights()


def largest_difference(a, b):
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b))


def interrupted(dropout_seed, backup_dir):
    try:
        fit(classifier(dropout_seed), [AtomicBackupAndRestore(backup_dir, delete_checkpoint=False), Interrupt()])
    except RuntimeError as error:
        if str(error) != "interrupted":
            raise
    keras.utils.set_random_seed(123)  # a new process's global generators are elsewhere


def resumed(dropout_seed, backup_dir):
    model = classifier(dropout_seed)
    keras.utils.set_random_seed(123)
    return fit(model, [AtomicBackupAndRestore(backup_dir)])


for name, dropout_seed in (("seeded", 7), ("unseeded", None)):
    reference = fit(classifier(dropout_seed), [])
    with tempfile.TemporaryDirectory() as folder:
        interrupted(dropout_seed, folder)
        report.measure(f"{name}_dropout_resumed_vs_uninterrupted",
                       largest_difference(resumed(dropout_seed, folder), reference), 1e-6)
        if name == "unseeded" and keras.backend.backend() == "torch":
            interrupted(dropout_seed, folder)
            backup = os.path.join(folder, read_pointer(folder)["checkpoint"])
            report.expect("backup_holds_torch_generator_state", os.path.isfile(os.path.join(backup, TORCH_RNG_FILE)))
            os.remove(os.path.join(backup, TORCH_RNG_FILE))
            with open(os.path.join(backup, METADATA_FILE)) as handle:
                metadata = handle.read()
            with open(os.path.join(backup, METADATA_FILE), "w") as handle:
                handle.write(metadata.replace('"torch_rng_states"', '"torch_rng_states_removed"'))
            without = largest_difference(resumed(dropout_seed, folder), reference)
            report.record["unseeded_dropout_resumed_without_torch_state_vs_uninterrupted"] = without
            report.expect("torch_state_matters", without > 1e-3, f"(resumed without it: {without:.3g} away)")
report.finish()
