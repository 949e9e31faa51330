"""``commit_directory`` survives a kill at every step of a commit: each file-system call it makes (a rename, a
directory removal) is made to fail once, as a kill there would stop the process, and a restore afterwards must
find a complete checkpoint, the old one or the new one. Checked with ``max_to_keep=1`` (one complete checkpoint
at a time) for a new step and for the same step written again (a resumed run re-saving it)."""
import os
import shutil

import keras
import numpy as np
import pytest

from training.distributed import checkpoints
from training.distributed.checkpoints import (TrainingCheckpoint, load_weights_backup, read_pointer,
                                              save_weights_backup)


class Killed(Exception):
    """What the injected failure raises: the process 'dies' in the middle of a commit."""


def _model(value):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.optimizer.build(model.trainable_variables)
    for weight in model.weights:
        weight.assign(np.full(weight.shape, value, dtype="float32"))
    return model


def _value(model):
    values = {float(v) for weight in model.weights for v in np.ravel(keras.ops.convert_to_numpy(weight))}
    assert len(values) == 1, values  # one checkpoint's weights, not a mix
    return values.pop()


class Injector:
    """Counts the file-system calls of the commits (``os.replace``, ``os.rename``, ``shutil.rmtree``) and makes the
    ``fail_at``-th one die: a rename dies before it happens (renames are atomic); a removal dies half-way, after
    deleting all its files but one (a damaged directory, as a real kill leaves one)."""

    def __init__(self, monkeypatch, fail_at=None):
        self.calls, self.fail_at, self.active = [], fail_at, False
        for module, name in ((os, "replace"), (os, "rename"), (shutil, "rmtree")):
            monkeypatch.setattr(module, name, self._wrap(name, getattr(module, name)))
        commit = checkpoints.commit_directory

        def counted_commit(*args, **kwargs):  # only the commit's own calls count (not those of saving the files)
            self.active = True
            try:
                return commit(*args, **kwargs)
            finally:
                self.active = False

        monkeypatch.setattr(checkpoints, "commit_directory", counted_commit)

    def _wrap(self, name, call):
        def wrapped(path, *args, **kwargs):
            if self.active:
                self.calls.append(name)
                if len(self.calls) - 1 == self.fail_at:
                    if name == "rmtree" and os.path.isdir(path):
                        files = sorted(f for f in os.listdir(path) if os.path.isfile(os.path.join(path, f)))
                        for file in files[:-1]:
                            os.remove(os.path.join(path, file))
                    raise Killed(f"killed at {name} {path}")
            return call(path, *args, **kwargs)

        return wrapped


def _weights_backup(directory, value, name):
    save_weights_backup(_model(value), directory, name, {"value": value}, max_to_keep=1)


def _restore_weights_backup(directory):
    model = _model(-1.0)
    progress = load_weights_backup(model, directory)
    assert progress["value"] == _value(model)  # the record and the weights of one checkpoint
    return _value(model)


def _training_checkpoint(directory, value, name):
    step = {"ckpt-a": 1, "ckpt-b": 2}[name]  # its name: ckpt-00000-000000{step}
    TrainingCheckpoint(directory, _model(value), max_to_keep=1).save(0, step)


def _restore_training_checkpoint(directory):
    model = _model(-1.0)
    assert TrainingCheckpoint(directory, model, max_to_keep=1).restore() != (0, 0)  # (0, 0): found none
    return _value(model)


WRITERS = {"weights_backup": (_weights_backup, _restore_weights_backup),
           "training_checkpoint": (_training_checkpoint, _restore_training_checkpoint)}


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("same_step", [True, False], ids=["same_step", "next_step"])
def test_commit_killed_at_any_call_leaves_a_complete_checkpoint(tmp_path, monkeypatch, writer, same_step):
    """Before the fix, the same step written again removed its old directory before the new one was renamed into
    place: with ``max_to_keep=1`` a kill in between (or during the removal) left no readable checkpoint (restore
    raised "no readable checkpoint"). Now the new one is renamed in and the pointer names it before any old one
    is removed."""
    save, restore = WRITERS[writer]
    second = "ckpt-a" if same_step else "ckpt-b"
    counter = Injector(monkeypatch)
    save(str(tmp_path / "count"), 1.0, "ckpt-a")
    counter.calls.clear()
    save(str(tmp_path / "count"), 2.0, second)
    assert restore(str(tmp_path / "count")) == 2.0
    steps = len(counter.calls)
    assert steps >= 2, counter.calls  # at least the rename into place and the pointer's
    monkeypatch.undo()

    for fail_at in range(steps):
        directory = str(tmp_path / f"killed-{fail_at}")
        injector = Injector(monkeypatch)
        save(directory, 1.0, "ckpt-a")
        injector.fail_at = len(injector.calls) + fail_at  # the fail_at-th call of the second commit
        with pytest.raises(Killed):
            save(directory, 2.0, second)
        monkeypatch.undo()
        found = restore(directory)
        assert found in (1.0, 2.0), (fail_at, counter.calls, found)

        # and the run, restarted, commits again: the checkpoint directory is usable after the kill
        save(directory, 3.0, second)
        assert restore(directory) == 3.0
        pointer = read_pointer(directory)
        assert len(pointer["history"]) == 1 and os.path.isdir(os.path.join(directory, pointer["checkpoint"]))
