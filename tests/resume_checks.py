"""Shared pieces of the resume tests: interrupt a fit after an epoch, resume it with
``keras.callbacks.BackupAndRestore`` in a fresh model, compare with an uninterrupted run (its model, or the
weights file it wrote)."""
import keras
import numpy as np
import pytest


class Interrupt(keras.callbacks.Callback):
    """Raises at the end of epoch ``epoch`` (after the callbacks before it, BackupAndRestore included, ran)."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("interrupted")


class RecordBatches(keras.callbacks.Callback):
    """Records ``(fit's epoch, the epoch the seeded batches serve)`` at every training batch."""

    def __init__(self, batches):
        super().__init__()
        self.batches, self.epochs, self._epoch = batches, [], None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.epochs.append((self._epoch, self.batches.epoch))


def fit_uninterrupted(setup, epochs):
    """``setup()`` returns a fresh ``(model, fit_kwargs, callbacks)``; returns them after ``epochs`` epochs."""
    model, fit_kwargs, callbacks = setup()
    model.fit(**fit_kwargs, epochs=epochs, callbacks=list(callbacks), verbose=0)
    return model, callbacks


def fit_interrupted_and_resumed(setup, epochs, interrupt_after, backup_dir):
    """Fit until the end of epoch ``interrupt_after`` (which raises), then fit a fresh ``setup()`` (a new process
    would build the same) with ``BackupAndRestore`` from the same directory; returns the resumed model, callbacks."""
    model, fit_kwargs, callbacks = setup()
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(**fit_kwargs, epochs=epochs, verbose=0,
                  callbacks=list(callbacks) + [keras.callbacks.BackupAndRestore(str(backup_dir)),
                                               Interrupt(interrupt_after)])
    model, fit_kwargs, callbacks = setup()
    model.fit(**fit_kwargs, epochs=epochs, verbose=0,
              callbacks=list(callbacks) + [keras.callbacks.BackupAndRestore(str(backup_dir))])
    return model, callbacks


def assert_same_weights(a, b, atol=1e-6):
    """All weights (layer states included) equal; the models are two builds of the same architecture."""
    assert [w.path.split("/", 1)[-1] for w in a.weights] == [w.path.split("/", 1)[-1] for w in b.weights]
    for wa, wb in zip(a.weights, b.weights):
        np.testing.assert_allclose(np.asarray(wb), np.asarray(wa), rtol=0, atol=atol, err_msg=wa.path)


def weights_file_arrays(path):
    """``{dataset path: array}`` of every dataset in the ``.weights.h5`` file ``path``."""
    import h5py

    found = {}
    with h5py.File(path, "r") as handle:
        handle.visititems(lambda name, item: found.update({name: np.asarray(item)})
                          if isinstance(item, h5py.Dataset) else None)
    return found
