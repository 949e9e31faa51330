"""Fault tolerance: a training process killed with SIGKILL and restarted resumes from its last
checkpoint and ends with the variables of an uninterrupted run; checkpoints are never half-written."""
import json
import os
import signal
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

import distributed_models as dm
from ot_layers.callbacks import PrototypeReassignment
from training.distributed.checkpoints import (AtomicBackupAndRestore, TrainingCheckpoint, read_pointer,
                                              seed_generator_states)
from training.distributed.fit import distributed_fit, fit
from training.distributed.strategies import make_strategy

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def assert_close(found, expected, atol):
    assert sorted(found) == sorted(expected)
    for key in expected:
        np.testing.assert_allclose(found[key], expected[key], rtol=0, atol=atol, err_msg=key)


def _run_process(*args):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return subprocess.run([sys.executable, WORKER, "--strategy=default", *map(str, args)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=240)


@pytest.mark.slow
def test_fault_model_fit_sigkill_resume_with_backup_and_restore(tmp_path):
    """``training.distributed.fit`` = ``model.fit`` + ``AtomicBackupAndRestore`` in a subprocess SIGKILLed in the
    middle of its second epoch, restarted: equals an uninterrupted ``model.fit`` here (weights, momenta, the
    hyperspherical head's assignment and representatives driven by PrototypeReassignment)."""
    checkpoint, out = tmp_path / "backup", tmp_path / "out"
    common = ["--model", "hyperspherical", "--epochs", 3, "--batch-size", 16, "--checkpoint", checkpoint,
              "--out", out]
    crashed = _run_process(*common, "--kill-at-step", 6, "--kill-worker", 0)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert read_pointer(str(checkpoint))["epoch"] == 1  # epoch 0's backup; the kill came in epoch 1
    resumed = _run_process(*common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not checkpoint.exists()
    history = json.loads((out / "worker-0.json").read_text())["history"]
    assert len(history["loss"]) == 2  # epochs 1 and 2 only: epoch 0 was restored, not re-run

    images, labels = dm.synthetic_data(64)
    reference = dm.hyperspherical_training()
    reference.fit(dm.dataset(images, labels, 16, inputs="images_labels"), epochs=3, verbose=0,
                  callbacks=[PrototypeReassignment(batch_frequency=3)])
    assert_close(dict(np.load(out / "worker-0.npz")), dm.weights_by_path(reference), atol=1e-6)


class Interrupt(keras.callbacks.Callback):
    """Raises after the ``after``-th training batch of this run (an exception, not a kill: same process)."""

    def __init__(self, after):
        super().__init__()
        self.after, self.seen = after, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.after:
            raise RuntimeError("interrupted")


def test_resume_loop_mid_epoch_equals_uninterrupted(tmp_path):
    """The project's loop (the multi-worker one, here under a 2-replica MirroredStrategy in one process) stopped
    mid-epoch after a step-level checkpoint resumes at that step: the result equals an uninterrupted ``model.fit``
    with the same strategy, EarlyStopping's counters included."""
    images, labels = dm.synthetic_data(64)
    data = dm.dataset(images, labels, 16)
    strategy = make_strategy("mirrored", ["/cpu:0", "/cpu:1"])

    def run(callbacks, checkpoint_dir=None, loop=True):
        with strategy.scope():
            model = dm.mpw_classifier()
        if loop:
            distributed_fit(model, strategy, data, 3, callbacks, checkpoint_dir=checkpoint_dir, save_freq=3,
                            verbose=0)
        else:
            model.fit(data, epochs=3, callbacks=callbacks, verbose=0)
        return model

    stopper = keras.callbacks.EarlyStopping("loss", patience=5, min_delta=10.0)  # never improves by 10: wait counts
    with pytest.raises(RuntimeError, match="interrupted"):
        run([stopper, Interrupt(6)], tmp_path / "ckpt")
    pointer = read_pointer(str(tmp_path / "ckpt"))
    assert (pointer["epoch"], pointer["step"]) == (1, 0)  # epoch 0's end; the step-3 save of epoch 1 came later
    with pytest.raises(RuntimeError, match="interrupted"):
        run([stopper, Interrupt(4)], tmp_path / "ckpt")  # resumes at (1, 0), stops in epoch 1 after its step-3 save
    pointer = read_pointer(str(tmp_path / "ckpt"))
    assert (pointer["epoch"], pointer["step"]) == (1, 3)
    resumed_stopper = keras.callbacks.EarlyStopping("loss", patience=5, min_delta=10.0)
    resumed = run([resumed_stopper], tmp_path / "ckpt")
    reference_stopper = keras.callbacks.EarlyStopping("loss", patience=5, min_delta=10.0)
    reference = run([reference_stopper], loop=False)
    assert_close(dm.weights_by_path(resumed), dm.weights_by_path(reference), atol=1e-6)
    assert resumed_stopper.wait == reference_stopper.wait == 2
    assert not (tmp_path / "ckpt").exists()


def _mirrored_model(strategy, **kwargs):
    with strategy.scope():
        return dm.mpw_classifier(**kwargs)


@pytest.mark.parametrize("kind", ["repeated", "finite"])
def test_resume_loop_with_steps_per_epoch_reads_on_where_it_stopped(tmp_path, kind):
    """A dataset read ``steps_per_epoch`` batches at a time (one iterator across epochs, as model.fit reads it; the
    finite one, 4 batches read 3 at a time, ends every second epoch early and starts again) resumed mid-epoch skips
    to where the uninterrupted run was: weights and the resumed epochs' logs equal an uninterrupted ``model.fit``."""
    images, labels = dm.synthetic_data(64)
    data = dm.dataset(images, labels, 16)  # 4 batches
    if kind == "repeated":
        data = data.repeat()
    strategy = make_strategy("mirrored", ["/cpu:0", "/cpu:1"])

    with pytest.raises(RuntimeError, match="interrupted"):  # saves after every batch; stops in epoch 1 (2 for finite)
        distributed_fit(_mirrored_model(strategy), strategy, data, 4, [Interrupt(5 if kind == "repeated" else 6)],
                        checkpoint_dir=tmp_path / "ckpt", save_freq=1, steps_per_epoch=3, verbose=0)
    pointer = read_pointer(str(tmp_path / "ckpt"))
    resumed_at = (1, 1) if kind == "repeated" else (2, 1)
    assert (pointer["epoch"], pointer["step"]) == resumed_at
    resumed = _mirrored_model(strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the finite dataset runs out in the middle of an epoch: both warn
        history = distributed_fit(resumed, strategy, data, 4, checkpoint_dir=tmp_path / "ckpt", save_freq=1,
                                  steps_per_epoch=3, verbose=0).history
        reference = _mirrored_model(strategy)
        expected = reference.fit(data, epochs=4, steps_per_epoch=3, verbose=0).history
    assert_close(dm.weights_by_path(resumed), dm.weights_by_path(reference), atol=1e-6)
    for key in expected:  # the resumed run logged the epochs from the one it resumed in
        np.testing.assert_allclose(history[key], expected[key][resumed_at[0]:], rtol=1e-5, err_msg=key)


def test_resume_loop_restores_early_stopping_best_weights(tmp_path):
    """``EarlyStopping(restore_best_weights=True)``'s best weights are saved with the checkpoint: a run stopped after
    epoch 1 and resumed ends with the same weights as an uninterrupted one (epoch 0's, the best; the resumed run
    took epoch 2's, the first it saw)."""
    images, labels = dm.synthetic_data(64)
    data = dm.dataset(images, labels, 16)
    strategy = make_strategy("mirrored", ["/cpu:0", "/cpu:1"])

    def stopper():  # epoch 0 is the best (no later epoch improves by 10); stops at epoch 3
        return keras.callbacks.EarlyStopping("loss", patience=3, min_delta=10.0, restore_best_weights=True)

    reference_stopper = stopper()
    reference = _mirrored_model(strategy)
    distributed_fit(reference, strategy, data, 6, [reference_stopper], verbose=0)
    assert (reference_stopper.best_epoch, reference_stopper.stopped_epoch) == (0, 3)
    with pytest.raises(RuntimeError, match="interrupted"):
        distributed_fit(_mirrored_model(strategy), strategy, data, 6, [stopper(), Interrupt(10)],
                        checkpoint_dir=tmp_path / "ckpt", verbose=0)
    assert read_pointer(str(tmp_path / "ckpt"))["epoch"] == 2
    resumed_stopper = stopper()
    resumed = _mirrored_model(strategy)
    history = distributed_fit(resumed, strategy, data, 6, [resumed_stopper], checkpoint_dir=tmp_path / "ckpt",
                              verbose=0).history
    assert len(history["loss"]) == 2  # epochs 2 and 3
    assert (resumed_stopper.best_epoch, resumed_stopper.stopped_epoch) == (0, 3)
    assert_close(dm.weights_by_path(resumed), dm.weights_by_path(reference), atol=1e-6)


def test_resume_loop_mid_epoch_logs_the_whole_epoch(tmp_path):
    """The loss and metric totals are saved with a mid-epoch checkpoint and not reset when the run resumes in that
    epoch: its logs (what EarlyStopping, ReduceLROnPlateau and CSVLogger see) cover all its batches, not only those
    run after the restart, and equal an uninterrupted ``model.fit``'s (2 replicas: the metrics' per-replica
    totals)."""
    images, labels = dm.synthetic_data(64)
    data = dm.dataset(images, labels, 16)
    strategy = make_strategy("mirrored", ["/cpu:0", "/cpu:1"])
    with pytest.raises(RuntimeError, match="interrupted"):  # the 4th batch of epoch 1, after its step-3 save
        distributed_fit(_mirrored_model(strategy), strategy, data, 3, [Interrupt(8)],
                        checkpoint_dir=tmp_path / "ckpt", save_freq=3, verbose=0)
    pointer = read_pointer(str(tmp_path / "ckpt"))
    assert (pointer["epoch"], pointer["step"]) == (1, 3)
    resumed = _mirrored_model(strategy)
    history = distributed_fit(resumed, strategy, data, 3, checkpoint_dir=tmp_path / "ckpt", save_freq=3,
                              verbose=0).history
    reference = _mirrored_model(strategy)
    expected = reference.fit(data, epochs=3, verbose=0).history
    assert sorted(history) == ["accuracy", "loss"]
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key][1:], rtol=1e-5, err_msg=key)
    assert_close(dm.weights_by_path(resumed), dm.weights_by_path(reference), atol=1e-6)


def _values(model):
    return [np.asarray(v).copy() for v in model.weights + model.optimizer.variables]


def test_fault_checkpoint_falls_back_when_the_newest_is_damaged(tmp_path):
    """A stray temporary directory (a kill during a write) is ignored, and a damaged newest checkpoint makes
    restore fall back to the previous complete one, with its values and counters."""
    images, labels = dm.synthetic_data(32)
    model = dm.mpw_classifier()
    model.fit(dm.dataset(images, labels, 16), epochs=1, verbose=0)
    checkpoint = TrainingCheckpoint(tmp_path, model)
    checkpoint.save(1, 0)
    saved = _values(model)
    model.fit(dm.dataset(images, labels, 16), epochs=1, verbose=0)
    newest = checkpoint.save(1, 2)
    (tmp_path / ".tmp-ckpt-00002-0000000-123-abc").mkdir()  # what a kill during the third write leaves
    for name in os.listdir(newest):
        if name.startswith("state.data"):
            with open(os.path.join(newest, name), "r+b") as handle:
                handle.truncate(8)

    fresh = dm.mpw_classifier()
    fresh.optimizer.build(fresh.trainable_variables)
    assert TrainingCheckpoint(tmp_path, fresh).restore() == (1, 0)
    for found, expected in zip(_values(fresh), saved):
        np.testing.assert_array_equal(found, expected)


def test_fault_atomic_backup_ignores_unfinished_writes(tmp_path):
    """``AtomicBackupAndRestore``: a backup directory never renamed into place (killed mid-write) and a
    damaged newest backup are skipped; ``fit`` resumes from the last complete one."""
    images, labels = dm.synthetic_data(32)
    data = dm.dataset(images, labels, 16)
    model = dm.mpw_classifier()
    fit(model, data, epochs=2, callbacks=[AtomicBackupAndRestore(str(tmp_path), delete_checkpoint=False)],
        verbose=0)
    pointer = read_pointer(str(tmp_path))
    assert pointer["epoch"] == 2 and len(pointer["history"]) == 2
    with open(tmp_path / pointer["checkpoint"] / "latest.weights.h5", "r+b") as handle:
        handle.truncate(100)
    (tmp_path / ".tmp-ckpt-00003-0000000-1-x").mkdir()

    reference = dm.mpw_classifier()
    reference.fit(data, epochs=3, verbose=0)
    resumed = dm.mpw_classifier()
    history = resumed.fit(data, epochs=3, callbacks=[AtomicBackupAndRestore(str(tmp_path))], verbose=0)
    assert len(history.history["loss"]) == 2  # resumed after epoch 1 (the epoch-2 backup was damaged)
    assert_close(dm.weights_by_path(resumed), dm.weights_by_path(reference), atol=1e-6)


def test_resume_loop_from_a_checkpoint_without_position_on_data_of_unknown_length(tmp_path):
    """A checkpoint of an earlier otzoo records no position in the data. For a dataset of unknown length the loop
    guessed ``epoch * steps + step`` batches, past the data's end, took that for the length and failed
    (``OutOfRangeError``); it now starts from the epoch's own batches, as the earlier otzoo read them."""
    images, labels = dm.synthetic_data(64)
    data = dm.dataset(images, labels, 16).filter(lambda x, y: True)  # 4 batches, length unknown
    strategy = __import__("tensorflow").distribute.get_strategy()  # the default one the models are built under

    class InterruptInEpoch2(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == 2 and batch == 1:
                raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        distributed_fit(dm.mpw_classifier(), strategy, data, 8, [InterruptInEpoch2()],
                        checkpoint_dir=tmp_path / "ckpt", save_freq=1, steps_per_epoch=3, verbose=0)
    pointer = read_pointer(str(tmp_path / "ckpt"))
    assert (pointer["epoch"], pointer["step"]) == (2, 1)  # 2 * 3 + 1 batches guessed: past the 4 there are
    record = tmp_path / "ckpt" / pointer["checkpoint"] / "progress.json"
    progress = json.loads(record.read_text())
    progress.pop("position")
    record.write_text(json.dumps(progress))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the data run out within some epochs (4 batches, 3 a step)
        history = distributed_fit(dm.mpw_classifier(), strategy, data, 8, [], checkpoint_dir=tmp_path / "ckpt",
                                  save_freq=1, steps_per_epoch=3, verbose=0).history
    assert len(history["loss"]) == 6 and np.all(np.isfinite(history["loss"]))


def test_model_fit_resume_restores_early_stopping_and_plateau_state(tmp_path):
    """Under ``model.fit`` too (``training.distributed.fit`` on one device), the backups carry ``EarlyStopping``'s
    counters and best weights and ``ReduceLROnPlateau``'s counters: a run stopped after epoch 1 and resumed stops at
    the epoch, with the learning rate and the weights, of an uninterrupted run (Keras' own callback keeps none: the
    resumed run waited its patience again and restored the first epoch it saw)."""
    images, labels = dm.synthetic_data(64)
    data = dm.dataset(images, labels, 16)

    def watchers():  # epoch 0 is the best (no later epoch improves by 10); the rate halves after epoch 1, stops at 3
        return [keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=1, min_delta=10.0),
                keras.callbacks.EarlyStopping("loss", patience=3, min_delta=10.0, restore_best_weights=True)]

    reference, reference_watchers = dm.mpw_classifier(), watchers()
    fit(reference, data, epochs=8, callbacks=reference_watchers, verbose=0)
    assert (reference_watchers[1].best_epoch, reference_watchers[1].stopped_epoch) == (0, 3)
    with pytest.raises(RuntimeError, match="interrupted"):  # after the epoch-1 backup
        fit(dm.mpw_classifier(), data, epochs=8, callbacks=watchers() + [Interrupt(9)],
            checkpoint_dir=str(tmp_path / "backup"), verbose=0)
    assert read_pointer(str(tmp_path / "backup"))["epoch"] == 2
    resumed, resumed_watchers = dm.mpw_classifier(), watchers()
    _, history = fit(resumed, data, epochs=8, callbacks=resumed_watchers, checkpoint_dir=str(tmp_path / "backup"),
                     verbose=0)
    assert len(history.history["loss"]) == 2  # epochs 2 and 3
    assert (resumed_watchers[1].best_epoch, resumed_watchers[1].stopped_epoch) == (0, 3)
    assert float(resumed.optimizer.learning_rate) == pytest.approx(float(reference.optimizer.learning_rate))
    assert_close(dm.weights_by_path(resumed), dm.weights_by_path(reference), atol=1e-6)


def test_fault_plain_backup_and_restore_is_made_atomic(tmp_path):
    """``training.distributed.fit`` turns a ``keras.callbacks.BackupAndRestore`` into ``AtomicBackupAndRestore`` on
    the same directory (its layout: a ``latest`` pointer to a complete checkpoint directory)."""
    images, labels = dm.synthetic_data(32)
    fit(dm.mpw_classifier(), dm.dataset(images, labels, 16), epochs=1, verbose=0,
        callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path), delete_checkpoint=False)])
    pointer = read_pointer(str(tmp_path))
    assert pointer["epoch"] == 1
    assert sorted(os.listdir(tmp_path / pointer["checkpoint"])) == ["latest.weights.h5", "training_metadata.json"]


def test_fault_resumes_a_backup_of_the_stock_keras_callback(tmp_path):
    """A run started with Keras' own ``BackupAndRestore`` (plain ``model.fit``) resumes under
    ``training.distributed.fit`` (``AtomicBackupAndRestore``): it continues at the stock backup's epoch and equals an
    uninterrupted run."""
    images, labels = dm.synthetic_data(32)
    data = dm.dataset(images, labels, 16)
    started = dm.mpw_classifier()
    started.fit(data, epochs=1, verbose=0,
                callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path), delete_checkpoint=False)])
    assert sorted(os.listdir(tmp_path)) == ["latest.weights.h5", "training_metadata.json"]  # the stock layout

    reference = dm.mpw_classifier()
    reference.fit(data, epochs=3, verbose=0)
    resumed = dm.mpw_classifier()
    _, history = fit(resumed, data, epochs=3, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path))])
    assert len(history.history["loss"]) == 2  # epochs 1 and 2: epoch 0 came from the stock backup
    assert_close(dm.weights_by_path(resumed), dm.weights_by_path(reference), atol=1e-6)


def _dropout_model(seed=0):
    """A small classifier with ``Dropout`` (a ``keras.random.SeedGenerator`` whose state advances every step)."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input(dm.IMAGE_SHAPE),
                              keras.layers.Conv2D(8, 3, strides=2, activation="relu", name="conv"),
                              keras.layers.Dropout(0.5, name="dropout"),
                              keras.layers.Flatten(name="flatten"),
                              keras.layers.Dense(dm.NUM_CLASSES, name="logits")], name="dropout_classifier")
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def _seed_states(model):
    return [np.asarray(v) for v in seed_generator_states(model)]


def test_resume_loop_with_dropout_equals_uninterrupted(tmp_path):
    """The random-generator states (``Dropout``'s) are checkpointed by the loop: they are no ``tf.train``
    trackables, so the model's checkpoint left them out and a resumed run drew the first epoch's masks again
    (weights 1e-2 away from an uninterrupted run's)."""
    images, labels = dm.synthetic_data(64)
    data = dm.dataset(images, labels, 16)  # 4 batches
    strategy = __import__("tensorflow").distribute.get_strategy()
    reference = _dropout_model()
    distributed_fit(reference, strategy, data, 3, [], verbose=0)
    assert len(seed_generator_states(reference)) == 1 and _seed_states(reference)[0][1] == 12  # 12 steps drawn

    with pytest.raises(RuntimeError, match="interrupted"):  # after the (1, 0) checkpoint, in epoch 1
        distributed_fit(_dropout_model(), strategy, data, 3, [Interrupt(6)], checkpoint_dir=tmp_path / "ckpt",
                        save_freq=3, verbose=0)
    assert (read_pointer(str(tmp_path / "ckpt"))["epoch"], read_pointer(str(tmp_path / "ckpt"))["step"]) == (1, 0)
    resumed = _dropout_model()
    history = distributed_fit(resumed, strategy, data, 3, [], checkpoint_dir=tmp_path / "ckpt", save_freq=3,
                              verbose=0).history
    assert len(history["loss"]) == 2
    np.testing.assert_array_equal(_seed_states(resumed)[0], _seed_states(reference)[0])
    assert_close(dm.weights_by_path(resumed), dm.weights_by_path(reference), atol=1e-6)


def test_model_fit_resume_with_dropout_equals_uninterrupted(tmp_path):
    """``AtomicBackupAndRestore`` keeps the random-generator states beside the weights (``model.save_weights``
    leaves them out): ``model.fit`` stopped after an epoch's backup and resumed draws the masks an uninterrupted
    run draws."""
    images, labels = dm.synthetic_data(64)
    data = dm.dataset(images, labels, 16)
    reference = _dropout_model()
    fit(reference, data, epochs=3, verbose=0)
    with pytest.raises(RuntimeError, match="interrupted"):  # in epoch 1, after epoch 0's backup
        fit(_dropout_model(), data, epochs=3, callbacks=[Interrupt(6)], checkpoint_dir=str(tmp_path / "backup"),
            verbose=0)
    assert read_pointer(str(tmp_path / "backup"))["epoch"] == 1
    resumed = _dropout_model()
    _, history = fit(resumed, data, epochs=3, checkpoint_dir=str(tmp_path / "backup"), verbose=0)
    assert len(history.history["loss"]) == 2
    np.testing.assert_array_equal(_seed_states(resumed)[0], _seed_states(reference)[0])
    assert_close(dm.weights_by_path(resumed), dm.weights_by_path(reference), atol=1e-6)


def test_a_checkpoint_without_random_generator_states_still_restores(tmp_path):
    """A checkpoint of an earlier otzoo holds no random-generator states (``seeds``, ``seeds.npz``): the loop's and
    ``model.fit``'s restore it all the same, the generators left as they are."""
    images, labels = dm.synthetic_data(32)
    model = _dropout_model()
    model.fit(dm.dataset(images, labels, 16), epochs=1, verbose=0)
    written = TrainingCheckpoint(tmp_path / "loop", model).save(1, 0)
    for name in os.listdir(written):
        if name.startswith("seeds"):
            os.remove(os.path.join(written, name))
    fresh = _dropout_model()
    fresh.optimizer.build(fresh.trainable_variables)
    checkpoint = TrainingCheckpoint(tmp_path / "loop", fresh)
    assert checkpoint.restore() == (1, 0) and not checkpoint.restored_seeds
    assert_close(dm.weights_by_path(fresh), dm.weights_by_path(model), atol=0)
    assert _seed_states(fresh)[0][1] == 0

    backup = tmp_path / "backup"
    fit(model, dm.dataset(images, labels, 16), epochs=1, verbose=0,
        callbacks=[AtomicBackupAndRestore(str(backup), delete_checkpoint=False)])
    folder = backup / read_pointer(str(backup))["checkpoint"]
    os.remove(folder / "seeds.npz")
    record = json.loads((folder / "training_metadata.json").read_text())
    record.pop("seed_states")
    (folder / "training_metadata.json").write_text(json.dumps(record))
    fresh = _dropout_model()
    history = fresh.fit(dm.dataset(images, labels, 16), epochs=2, verbose=0,
                        callbacks=[AtomicBackupAndRestore(str(backup))])
    assert len(history.history["loss"]) == 1  # resumed after epoch 0
