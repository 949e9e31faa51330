"""Checkpoints with backup-and-restore semantics that survive a kill at any instant.

Two writers share one rule: a checkpoint becomes visible only once it is complete. Each is written into a
temporary directory, renamed into place (``os.replace``, atomic on one file system), and only then is the small
``latest`` pointer file replaced (again write-then-rename). A process killed during a write leaves a stray
temporary directory, never a half-written checkpoint under the name that restore reads; the previous checkpoint
stays until the next one is complete (``max_to_keep`` complete ones are kept, and restore falls back to an older one
if the newest cannot be read).

- :class:`TrainingCheckpoint`: for ``training.distributed.fit``'s multi-worker loop. A ``tf.train.Checkpoint`` of the
  model (every layer variable: weights, BatchNorm statistics, prototype assignments, proxies, GSP warm-up flags, a
  ``CCPState`` attached to the model), the optimizer (iteration count, slots), the epoch and step counters and the
  Keras variables the callbacks own; a second one of the model's metric variables (the loss and metric totals of the
  epoch so far, so that an epoch resumed mid-way logs all its batches); a third of the layers' random-generator
  states (:func:`seed_generator_states`: ``Dropout``'s, a sampling ``PatchExtractor``'s, which are no ``tf.train``
  trackables, so the model's checkpoint leaves them out); the position in the data; and the Python
  state of callbacks that keep one (``EarlyStopping`` with its ``best_weights``, in ``callbacks.npz``,
  ``ReduceLROnPlateau``, or any callback with ``get_checkpoint_state`` / ``set_checkpoint_state``). Under
  ``MultiWorkerMirroredStrategy`` every worker calls :meth:`save` (saving may read variables through collective
  ops, which need every worker), the chief into the real directory and the other workers into their own temporary
  directories, deleted right after -- TensorFlow's recommended pattern. The directory must be on storage every
  worker reads (one host, NFS, GCS) for a restarted cluster to restore from it.
- :class:`AtomicBackupAndRestore`: ``keras.callbacks.BackupAndRestore`` for ``model.fit`` with the same atomic
  writes (the stock callback overwrites ``latest.weights.h5`` in place and writes its epoch counter in a second
  file, so a kill between the two, or during the first, leaves a checkpoint that resumes wrongly or not at all),
  and with the layers' random-generator states, which ``model.save_weights`` leaves out.
- :func:`save_weights_backup` / :func:`load_weights_backup`: a backup of a model's weights (its optimizer's
  included) with a JSON record of the progress, on every Keras backend; what ``AtomicBackupAndRestore`` writes, and
  what a loop of its own (few-shot meta-training) checkpoints with.

The two trainers' restorers recognize each other's backups and refuse them with :class:`OtherTrainerError` (one line
naming the directory and the trainer that wrote them) instead of failing on a missing file or, for a backup of Keras'
own callback found by the loop, starting afresh.

Resuming equals an uninterrupted run when the data order of an epoch does not depend on how many epochs this
process has iterated: pass the data unshuffled, with a shuffle seeded per epoch, or (``training.distributed.fit``) as a
function ``epoch -> dataset``. ``tf.data``'s ``shuffle(seed=s, reshuffle_each_iteration=True)`` restarts its
sequence of orders in a new process, and ``Dataset.random(seed=s, rerandomize_each_iteration=True)`` (the
augmentation draws of ``training.data.pipelines``) its sequence of draws.
"""
import json
import os
import shutil
import tempfile
import uuid

import keras
import numpy as np

from ot_layers.optional import tensorflow_if_installed
from ot_layers.validation import check_positive_int
from training.distributed.strategies import is_chief, tf_config

tf = tensorflow_if_installed("tf.distribute checkpoints")

POINTER_FILE = "latest"
PREFIX = "ckpt-"
AGAIN = "-again"  # the name of a step's checkpoint written again while its first one is kept (commit_directory)
WEIGHTS_FILE, METADATA_FILE = "latest.weights.h5", "training_metadata.json"  # the files of a backup of weights
PROGRESS_FILE = "progress.json"  # TrainingCheckpoint's record of a checkpoint (beside its tf.train files)
SEEDS_FILE = "seeds.npz"  # AtomicBackupAndRestore: the layers' random-generator states
SEED_STATE = "seed_generator_state"  # the name of a keras.random.SeedGenerator's state variable
TORCH_RNG_FILE = "torch_rng.npz"  # AtomicBackupAndRestore on PyTorch: torch's global generator states
# What keras.callbacks.BackupAndRestore writes into its directory (read by AtomicBackupAndRestore when no atomic
# backup is there, so a run started with the stock callback resumes under this one).
KERAS_BACKUP_FILES = (WEIGHTS_FILE, METADATA_FILE)


def write_text_atomically(path, text):
    """Write ``text`` to ``path`` through a temporary file in the same directory and ``os.replace``."""
    temp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with open(temp, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


def _fsync_directory(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_pointer(directory):
    """The ``latest`` pointer of a checkpoint directory as a dict (``checkpoint``: the sub-directory name,
    ``epoch``, ``step``, ``history``: the names of the complete checkpoints, newest last), or ``None``."""
    path = os.path.join(directory, POINTER_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as handle:
        return json.load(handle)


def commit_directory(temp_dir, directory, name, pointer_fields, max_to_keep):
    """Rename the complete checkpoint ``temp_dir`` to ``directory/name``, point ``latest`` at it (with
    ``pointer_fields``) and delete all but the newest ``max_to_keep`` checkpoints. Returns the final path.

    Nothing the pointer names is removed before the pointer names the new checkpoint, so a kill at any instant
    leaves one complete checkpoint to restore. The same step written again (a resumed run re-saving it) therefore
    goes under another name, ``name`` + :data:`AGAIN` (or back to ``name``, alternating), while the old one stays
    until the pointer has moved: with ``max_to_keep=1`` the old one is the only complete checkpoint there is."""
    previous = read_pointer(directory) or {}
    history = [n for n in previous.get("history", []) if os.path.isdir(os.path.join(directory, n))]
    same_step = (name, f"{name}{AGAIN}")
    name = next(n for n in same_step if n not in history)  # at most one of them is in the history
    final = os.path.join(directory, name)
    if os.path.isdir(final):  # left by a kill in an earlier commit and named by no pointer: restore never reads it
        shutil.rmtree(final)
    os.replace(temp_dir, final)
    _fsync_directory(directory)
    keep = ([n for n in history if n not in same_step] + [name])[-max_to_keep:]
    write_text_atomically(os.path.join(directory, POINTER_FILE),
                           json.dumps(dict(pointer_fields, checkpoint=name, history=keep), indent=1))
    _fsync_directory(directory)
    for old in history:
        if old not in keep:
            shutil.rmtree(os.path.join(directory, old), ignore_errors=True)
    return final


def _temporary_dir(directory, tag):
    path = os.path.join(directory, f".tmp-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.makedirs(path)
    return path


class OtherTrainerError(ValueError):
    """A backup directory holds the backups of the other trainer: ``model.fit``'s (:class:`AtomicBackupAndRestore`,
    or Keras' own ``BackupAndRestore``) where the multi-worker loop's (:class:`TrainingCheckpoint`) are read, or the
    reverse. Neither can read the other's; the message names the directory and the trainer that wrote them."""


def _weights_backup_error(name, directory):
    return OtherTrainerError(
        f"`{name}` {directory!r} holds backups of model.fit ({WEIGHTS_FILE} and {METADATA_FILE}, written by "
        "BackupAndRestore), not checkpoints of training.distributed.fit's multi-worker loop, which cannot read "
        "them; resume them with model.fit (one process: otzoo train without --workers), or remove them to start "
        "afresh.")


def _loop_checkpoint_error(name, directory):
    return OtherTrainerError(
        f"`{name}` {directory!r} holds checkpoints of training.distributed.fit's multi-worker loop ({PROGRESS_FILE} "
        "and tf.train files, written by TrainingCheckpoint), not backups of model.fit, which cannot read them; "
        "resume them under MultiWorkerMirroredStrategy (otzoo train --workers N), or remove them to start afresh.")


def _is_weights_backup(path):
    return os.path.isfile(os.path.join(path, METADATA_FILE)) and not os.path.isfile(os.path.join(path, PROGRESS_FILE))


def _is_loop_checkpoint(path):
    return os.path.isfile(os.path.join(path, PROGRESS_FILE)) and not os.path.isfile(os.path.join(path, METADATA_FILE))


def seed_generator_states(model):
    """The state variables of the ``keras.random.SeedGenerator`` objects in ``model``'s layers (``Dropout``, random
    augmentation layers, ``ot_layers``' ``PatchExtractor(mode="sampling")``), in the model's order. They are part
    of ``model.variables`` but not of ``model.weights`` (``model.save_weights`` leaves them out) and are no
    ``tf.train`` trackables (a ``tf.train.Checkpoint`` of the model leaves them out): a run resumed without them
    draws the random numbers of its first steps again, and ends elsewhere than an uninterrupted run."""
    weights = {id(weight) for weight in model.weights}
    return [v for v in model.variables if id(v) not in weights and v.name == SEED_STATE]


def torch_global_rng_states():
    """On the PyTorch backend, torch's global random-generator states as ``{"cpu": bytes array, "cuda0": ..., ...}``
    (the CUDA devices' only once CUDA is initialized); ``{}`` on the other backends. Keras' unseeded ``Dropout``
    (``seed=None``) draws its masks from them there, not from a ``keras.random.SeedGenerator``."""
    if keras.backend.backend() != "torch":
        return {}
    import torch

    states = {"cpu": torch.get_rng_state().numpy()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.update({f"cuda{index}": state.numpy() for index, state in enumerate(torch.cuda.get_rng_state_all())})
    return states


def set_torch_global_rng_states(states):
    """Puts back what :func:`torch_global_rng_states` returned (``{}``, what it returns on the other backends: a
    no-op). CUDA states of devices this process does not have are left out."""
    if not states:
        return
    import torch

    torch.set_rng_state(torch.from_numpy(np.asarray(states["cpu"], dtype=np.uint8)))
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            if f"cuda{index}" in states:
                torch.cuda.set_rng_state(torch.from_numpy(np.asarray(states[f"cuda{index}"], dtype=np.uint8)),
                                         index)


# --- backups of a model's weights (optimizer included) with a small record of the progress -----------------------

def save_weights_backup(model, directory, name, progress, max_to_keep=2, write_extra=None):
    """Back up ``model``'s weights (``model.save_weights``: with its optimizer's variables once compiled and built)
    and the JSON dict ``progress`` (e.g. the epoch, or the episodes done) as ``directory/name``, written atomically
    (see the module docstring); the newest ``max_to_keep`` backups are kept. ``write_extra(folder)``: writes more
    files into the backup's folder before it is committed and returns a dict added to ``progress``. Returns the
    backup's path."""
    os.makedirs(directory, exist_ok=True)
    temp = _temporary_dir(directory, name)
    model.save_weights(os.path.join(temp, WEIGHTS_FILE))
    if write_extra is not None:
        progress = dict(progress, **write_extra(temp))
    with open(os.path.join(temp, METADATA_FILE), "w") as handle:
        json.dump(progress, handle)
    return commit_directory(temp, directory, name, progress, max_to_keep)


def load_weights_backup(model, directory, name="directory", keras_backup=False, read_extra=None):
    """Restore the newest readable backup :func:`save_weights_backup` wrote into ``directory`` into ``model`` (its
    optimizer is built first when it is compiled); returns the backup's ``progress`` dict, or ``None`` when the
    directory holds none. ``keras_backup``: also read a backup ``keras.callbacks.BackupAndRestore`` wrote (its files
    at the directory's top). ``read_extra(folder, progress)``: reads what ``write_extra`` wrote, before the weights
    (a backup it cannot read is skipped like a damaged one); its result is ``progress["extra"]``. A directory whose
    backups all fail to load raises ``ValueError`` naming ``name``; one holding checkpoints of the multi-worker loop
    (:class:`TrainingCheckpoint`) raises :class:`OtherTrainerError`."""
    pointer = read_pointer(directory) if os.path.isdir(directory) else None
    if pointer is not None:
        names = list(reversed(pointer.get("history", [pointer["checkpoint"]])))
    elif keras_backup and all(os.path.isfile(os.path.join(directory, f)) for f in KERAS_BACKUP_FILES):
        names = [""]  # a backup written by keras.callbacks.BackupAndRestore itself: read it as Keras would
    else:
        return None
    if getattr(model, "optimizer", None) is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    errors = []
    for backup in names:
        path = os.path.join(directory, backup)
        if _is_loop_checkpoint(path):
            raise _loop_checkpoint_error(name, directory)
        try:
            with open(os.path.join(path, METADATA_FILE)) as handle:
                progress = json.load(handle)
            extra = read_extra(path, progress) if read_extra is not None else None
            model.load_weights(os.path.join(path, WEIGHTS_FILE))
            if read_extra is not None:
                progress["extra"] = extra
        except Exception as error:  # noqa: BLE001 - a damaged file raises anything; the next one is tried
            errors.append(f"{backup}: {type(error).__name__}: {error}")
            continue
        return progress
    raise ValueError(f"`{name}` {directory!r}: no readable backup ({'; '.join(errors)}).")


# --- state of callbacks ------------------------------------------------------------------------------------------

def _variables_in(value):
    if isinstance(value, (keras.Variable, tf.Variable)):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for item in value for v in _variables_in(item)]
    if isinstance(value, dict):
        return [v for key in sorted(value, key=str) for v in _variables_in(value[key])]
    return []


def callback_variables(callback):
    """The Keras (or ``tf``) variables a callback holds in its own attributes (not through its model), in a fixed
    order; checkpointed with the model so that a callback keeping its state in variables resumes with it."""
    found = []
    for key in sorted(vars(callback)):
        if key in ("model", "_model"):
            continue
        found.extend(_variables_in(vars(callback)[key]))
    return found


_PYTHON_STATE = {  # Keras callbacks whose decisions live in Python attributes reset by on_train_begin
    keras.callbacks.EarlyStopping: ("wait", "best", "best_epoch", "stopped_epoch"),
    keras.callbacks.ReduceLROnPlateau: ("wait", "best", "cooldown_counter"),
}


# Keras callbacks' state held in lists of arrays (saved in ``callbacks.npz``): EarlyStopping's best weights, which
# ``restore_best_weights`` puts back at the end (``None`` until an epoch improved).
_ARRAY_STATE = {
    keras.callbacks.EarlyStopping: ("best_weights",),
}
ARRAYS_FILE = "callbacks.npz"


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return float(value)


def callback_keys(callbacks):
    """A stable key per callback: its class name and its rank among the callbacks of that class
    (``"EarlyStopping-0"``), so that state saved by one run finds its callback in the next even if other
    callbacks (a progress bar, a crash injector) come and go."""
    seen, keys = {}, []
    for callback in callbacks:
        name = type(callback).__name__
        keys.append(f"{name}-{seen.get(name, 0)}")
        seen[name] = seen.get(name, 0) + 1
    return keys


def callback_python_state(callback):
    """A JSON-able dict of a callback's Python state (``get_checkpoint_state()``, or the counters of
    ``EarlyStopping`` / ``ReduceLROnPlateau``), or ``None`` when it keeps none."""
    if hasattr(callback, "get_checkpoint_state"):
        return callback.get_checkpoint_state()
    for kind, names in _PYTHON_STATE.items():
        if isinstance(callback, kind):
            return {name: _jsonable(getattr(callback, name, None)) for name in names}
    return None


def callback_array_state(callback):
    """``{attribute: list of arrays or None}`` for the callbacks of ``_ARRAY_STATE`` (``EarlyStopping``'s
    ``best_weights``); ``{}`` for the others and for callbacks with ``get_checkpoint_state``."""
    if hasattr(callback, "get_checkpoint_state"):
        return {}
    for kind, names in _ARRAY_STATE.items():
        if isinstance(callback, kind):
            return {name: getattr(callback, name, None) for name in names}
    return {}


def set_callback_python_state(callback, state):
    """Inverse of :func:`callback_python_state` (call after ``on_train_begin``, which resets these counters)."""
    if state is None:
        return
    if hasattr(callback, "set_checkpoint_state"):
        callback.set_checkpoint_state(state)
        return
    for name, value in state.items():
        setattr(callback, name, value)


def write_callback_state(directory, keys, callbacks):
    """Write the arrays of ``callbacks`` (:func:`callback_array_state`) into ``directory/callbacks.npz``; returns
    ``{"callbacks": Python state by key, "callback_arrays": the arrays' layout}`` for the backup's JSON record, which
    :func:`read_callback_state` takes back."""
    arrays, layout = {}, {}
    for key, callback in zip(keys, callbacks):
        for attribute, value in callback_array_state(callback).items():
            layout.setdefault(key, {})[attribute] = None if value is None else len(value)
            for index, array in enumerate(value or ()):
                arrays[f"{key}.{attribute}.{index}"] = np.asarray(array)
    if arrays:
        with open(os.path.join(directory, ARRAYS_FILE), "wb") as handle:
            np.savez(handle, **arrays)
    return dict(callbacks={key: callback_python_state(cb) for key, cb in zip(keys, callbacks)},
                callback_arrays=layout)


def read_callback_state(directory, record):
    """``(Python state by key, {key: {attribute: list of arrays or None}})`` of the backup in ``directory`` whose
    JSON ``record`` :func:`write_callback_state` made (a record without them: none)."""
    layout = record.get("callback_arrays") or {}
    arrays = {}
    if any(count for attributes in layout.values() for count in attributes.values()):
        with np.load(os.path.join(directory, ARRAYS_FILE), allow_pickle=False) as stored:
            for key, attributes in layout.items():
                for attribute, count in attributes.items():
                    arrays.setdefault(key, {})[attribute] = (
                        None if count is None else [stored[f"{key}.{attribute}.{i}"] for i in range(count)])
    else:
        arrays = {key: {attribute: None if count is None else [] for attribute, count in attributes.items()}
                  for key, attributes in layout.items()}
    return record.get("callbacks") or {}, arrays


def apply_callback_state(keys, callbacks, python_state, array_state):
    """Give ``callbacks`` the state :func:`read_callback_state` read (after ``on_train_begin``, which resets it)."""
    for key, callback in zip(keys, callbacks):
        set_callback_python_state(callback, (python_state or {}).get(key))
        for attribute, value in (array_state or {}).get(key, {}).items():
            setattr(callback, attribute, value)


# --- the multi-worker loop's checkpoint --------------------------------------------------------------------------

class TrainingCheckpoint:
    """Backup and restore of a custom training loop's whole state in ``directory`` (see the module docstring).

    ``model``: a compiled Keras model (its optimizer is saved with it); ``callbacks``: the loop's callbacks (their
    variables and Python state are saved); ``max_to_keep``: complete checkpoints kept (>= 1).

    Usage in a loop: ``epoch, step = ckpt.restore()`` before training (``(0, 0)`` without a checkpoint; ``step`` is
    the number of batches of ``epoch`` already done), ``ckpt.save(epoch, step)`` after a batch or
    ``ckpt.save(epoch + 1, 0)`` after an epoch, ``ckpt.delete()`` when training has finished.
    """

    def __init__(self, directory, model, callbacks=(), max_to_keep=2):
        if not directory or not isinstance(directory, (str, os.PathLike)):
            raise ValueError(f"`directory` must be a non-empty path, got {directory!r}.")
        self.directory = os.fspath(directory)
        self.max_to_keep = check_positive_int("max_to_keep", max_to_keep)
        self.model, self.callbacks = model, list(callbacks)
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.keys = callback_keys(self.callbacks)
        owned = {key: callback_variables(cb) for key, cb in zip(self.keys, self.callbacks)}
        objects = dict(model=model, epoch=self.epoch, step=self.step,
                       callbacks={key: variables for key, variables in owned.items() if variables})
        if getattr(model, "optimizer", None) is not None:
            objects["optimizer"] = model.optimizer
        self.checkpoint = tf.train.Checkpoint(**objects)
        # The model's metric variables (loss and metric totals and counts: what ``reset_metrics`` clears), in a
        # checkpoint of their own ("metrics"): a checkpoint written without them, or for other metrics, still
        # restores the training state (the resumed epoch's totals then start at zero).
        metrics = list(getattr(model, "metrics_variables", []))
        self.metrics_checkpoint = tf.train.Checkpoint(metrics=metrics) if metrics else None
        # The layers' random-generator states (Dropout's masks), in a checkpoint of their own ("seeds"), read like
        # the metrics: a checkpoint written without them (by an earlier otzoo) still restores.
        seeds = seed_generator_states(model)
        self.seeds_checkpoint = tf.train.Checkpoint(seeds=seeds) if seeds else None
        self.position = None  # restore(): the saved position in the data, if any
        self.restored_metrics = False  # restore(): whether the metric variables were restored
        self.restored_seeds = False  # restore(): whether the random-generator states were restored
        self.chief = is_chief()

    def _name(self, epoch, step):
        return f"{PREFIX}{int(epoch):05d}-{int(step):07d}"

    def save(self, epoch, step=0, position=None):
        """Write the state after ``step`` batches of ``epoch`` (``step=0``: at the start of ``epoch``). Every worker
        must call it; only the chief's copy is kept. Returns the checkpoint's path (the chief's) or ``None``.
        ``position``: the loop's position in its data (the batches read from the current pass over a dataset whose
        iterator lives across epochs), returned by :meth:`restore` as ``self.position``."""
        self.epoch.assign(int(epoch))
        self.step.assign(int(step))
        os.makedirs(self.directory, exist_ok=True)
        if not self.chief:  # TensorFlow's pattern: the other workers write too (collectives), then delete
            config = tf_config() or {"task": {"type": "worker", "index": 0}}
            # Outside ``directory``: the chief removes that directory when training ends, possibly while this
            # worker still writes its copy of the last checkpoint.
            scratch = tempfile.mkdtemp(prefix=f"otzoo-{config['task']['type']}-{config['task'].get('index', 0)}-")
            self._write_variables(scratch)
            shutil.rmtree(scratch, ignore_errors=True)
            return None
        name = self._name(epoch, step)
        temp = _temporary_dir(self.directory, name)
        self._write_variables(temp)
        progress = dict(epoch=int(epoch), step=int(step), **write_callback_state(temp, self.keys, self.callbacks))
        if position is not None:
            progress["position"] = int(position)
        with open(os.path.join(temp, PROGRESS_FILE), "w") as handle:
            json.dump(progress, handle)
        return commit_directory(temp, self.directory, name, dict(epoch=int(epoch), step=int(step)),
                                self.max_to_keep)

    def _write_variables(self, directory):
        self.checkpoint.write(os.path.join(directory, "state"))
        if self.metrics_checkpoint is not None:
            self.metrics_checkpoint.write(os.path.join(directory, "metrics"))
        if self.seeds_checkpoint is not None:
            self.seeds_checkpoint.write(os.path.join(directory, "seeds"))

    def restore(self):
        """Load the newest readable checkpoint; returns ``(epoch, step)`` to continue from (``(0, 0)`` when there
        is none). The callbacks' Python state is kept for :meth:`restore_callback_state`; ``self.position`` is the
        position saved with it (``None`` if none was), ``self.restored_metrics`` whether the model's metric
        variables were restored and ``self.restored_seeds`` whether the layers' random-generator states were (a
        checkpoint of an earlier otzoo holds neither). A directory holding backups of ``model.fit``
        (:class:`AtomicBackupAndRestore`, Keras' ``BackupAndRestore``) raises :class:`OtherTrainerError`."""
        self._python_state, self._array_state = None, None
        self.position, self.restored_metrics, self.restored_seeds = None, False, False
        pointer = read_pointer(self.directory) if os.path.isdir(self.directory) else None
        if pointer is None:
            if os.path.isdir(self.directory) and all(os.path.isfile(os.path.join(self.directory, name))
                                                     for name in KERAS_BACKUP_FILES):
                raise _weights_backup_error("directory", self.directory)  # Keras' own BackupAndRestore's
            return 0, 0
        errors = []
        for name in reversed(pointer.get("history", [pointer["checkpoint"]])):
            path = os.path.join(self.directory, name)
            if _is_weights_backup(path):
                raise _weights_backup_error("directory", self.directory)
            try:
                with open(os.path.join(path, PROGRESS_FILE)) as handle:
                    progress = json.load(handle)
                python_state, array_state = read_callback_state(path, progress)
                self.checkpoint.read(os.path.join(path, "state")).assert_existing_objects_matched()
                restored_metrics = self._read_part(self.metrics_checkpoint, os.path.join(path, "metrics"))
                restored_seeds = self._read_part(self.seeds_checkpoint, os.path.join(path, "seeds"))
            except Exception as error:  # noqa: BLE001 - a damaged file raises anything; the next one is tried
                errors.append(f"{name}: {type(error).__name__}: {error}")
                continue
            self._python_state, self._array_state = python_state, array_state
            self.position, self.restored_metrics = progress.get("position"), restored_metrics
            self.restored_seeds = restored_seeds
            return int(self.epoch.numpy()), int(self.step.numpy())
        raise ValueError(f"`directory` {self.directory!r}: no readable checkpoint ({'; '.join(errors)}).")

    @staticmethod
    def _read_part(checkpoint, prefix):
        """Restore ``checkpoint`` (the metric variables, or the random-generator states) from ``prefix``; ``False``
        when there is nothing to restore or it does not match (the loop then resets the metrics; the generators
        keep their initial states, as with a checkpoint of an earlier otzoo)."""
        if checkpoint is None or not tf.io.gfile.exists(f"{prefix}.index"):
            return False
        try:
            checkpoint.read(prefix).assert_existing_objects_matched()
        except Exception:  # noqa: BLE001 - other metrics or layers than the run that saved them: not the training
            return False  # state itself
        return True

    def restore_callback_state(self):
        """Give the callbacks their saved Python state and arrays (``EarlyStopping``'s ``best_weights``) after
        ``on_train_begin``, which resets them."""
        apply_callback_state(self.keys, self.callbacks, getattr(self, "_python_state", None),
                             getattr(self, "_array_state", None))

    def delete(self):
        """Remove the directory (chief only), as ``BackupAndRestore`` does when training finishes."""
        if self.chief:
            shutil.rmtree(self.directory, ignore_errors=True)


# --- model.fit's callback ----------------------------------------------------------------------------------------

class AtomicBackupAndRestore(keras.callbacks.BackupAndRestore):
    """``keras.callbacks.BackupAndRestore`` whose backups are written atomically (see the module docstring).

    Same arguments and semantics as the Keras callback (``save_freq`` ``"epoch"`` or a number of batches,
    ``delete_checkpoint``): at ``fit`` start the newest complete backup is loaded and training continues at its
    epoch (a backup taken mid-epoch re-runs that epoch from its first batch with the backed-up weights, as the
    Keras callback does). Each backup is a directory ``ckpt-EEEEE-BBBBBBB`` (``-again`` appended for a batch
    backed up again, see :func:`commit_directory`) holding ``latest.weights.h5`` and ``training_metadata.json``,
    renamed into place when complete; ``latest`` names the newest. ``max_to_keep`` complete backups are kept (the
    Keras callback's ``double_checkpoint`` is ``max_to_keep=2``). A directory
    holding only a backup of the stock callback (``latest.weights.h5`` and ``training_metadata.json`` at its top)
    is resumed from as Keras would; one holding checkpoints of the multi-worker loop (:class:`TrainingCheckpoint`)
    raises :class:`OtherTrainerError` naming ``backup_dir``.

    Each backup also holds the layers' random-generator states (:func:`seed_generator_states`, ``seeds.npz``:
    ``Dropout``'s masks), which ``model.save_weights`` leaves out, so a run resumed at the epoch of its backup
    draws the random numbers an uninterrupted run would (a backup without them, of an earlier otzoo or of the stock
    callback, leaves the generators as they are). On PyTorch a layer must be given a ``seed`` for that: Keras'
    unseeded ``Dropout`` there draws from torch's global generator, which no backup holds.

    ``callbacks``: the run's other callbacks whose Python state rides in the backups, as in the multi-worker loop's
    checkpoints: ``EarlyStopping``'s counters and best weights, ``ReduceLROnPlateau``'s counters, and the state of
    any callback with ``get_checkpoint_state`` / ``set_checkpoint_state`` (Keras' own callback keeps none: a
    resumed run waited its patience again and restored other best weights). Their state is put back at the first
    epoch's start, after every callback's ``on_train_begin`` (which resets it). Place this callback after them
    (``training.distributed.fit`` does), so that an epoch's backup holds their decisions of that epoch.
    """

    def __init__(self, backup_dir, save_freq="epoch", delete_checkpoint=True, max_to_keep=2, callbacks=()):
        super().__init__(backup_dir, save_freq=save_freq, delete_checkpoint=delete_checkpoint)
        self.max_to_keep = check_positive_int("max_to_keep", max_to_keep)
        self.callbacks = [cb for cb in callbacks if cb is not self]
        self._keys = callback_keys(self.callbacks)
        self._restored_state = None

    def on_train_begin(self, logs=None):
        self._load_model()

    def on_epoch_begin(self, epoch, logs=None):
        if self._restored_state is not None:  # after every on_train_begin, which reset these counters
            apply_callback_state(self._keys, self.callbacks, *self._restored_state)
            self._restored_state = None

    def _load_model(self):
        if not self.model.built:
            raise ValueError("`model` must be built before fit() to use AtomicBackupAndRestore (call it on a batch).")
        metadata = load_weights_backup(self.model, self.backup_dir, name="backup_dir", keras_backup=True,
                                       read_extra=self._read_extra)
        self._restored_state = None
        if metadata is not None:
            self._current_epoch = metadata["epoch"]
            self.model._initial_epoch = metadata["epoch"]  # noqa: SLF001 - how BackupAndRestore tells fit
            python_state, array_state, seeds, torch_states = metadata["extra"]
            self._restored_state = python_state, array_state
            if seeds is not None:
                for variable, value in zip(seed_generator_states(self.model), seeds):
                    variable.assign(value)
            set_torch_global_rng_states(torch_states)

    def _write_extra(self, folder):
        record = write_callback_state(folder, self._keys, self.callbacks)
        seeds = seed_generator_states(self.model)
        if seeds:
            with open(os.path.join(folder, SEEDS_FILE), "wb") as handle:
                np.savez(handle, *[keras.ops.convert_to_numpy(variable.value) for variable in seeds])
            record["seed_states"] = len(seeds)
        torch_states = torch_global_rng_states()
        if torch_states:
            with open(os.path.join(folder, TORCH_RNG_FILE), "wb") as handle:
                np.savez(handle, **torch_states)
            record["torch_rng_states"] = sorted(torch_states)
        return record

    def _read_extra(self, folder, progress):
        """``(Python state, arrays, seed states or None, torch's global generator states or {})`` of the backup in
        ``folder``; seed states that do not fit this model (another count or shape) are an error, so the backup is
        skipped like a damaged one. Torch's states are read only on the PyTorch backend (another backend's
        unseeded layers do not draw from them)."""
        python_state, array_state = read_callback_state(folder, progress)
        count, seeds = progress.get("seed_states"), None
        if count:
            variables = seed_generator_states(self.model)
            with np.load(os.path.join(folder, SEEDS_FILE), allow_pickle=False) as stored:
                seeds = [stored[f"arr_{index}"] for index in range(count)]
            stored_shapes, shapes = [value.shape for value in seeds], [tuple(v.shape) for v in variables]
            if stored_shapes != shapes:
                raise ValueError(f"{count} random-generator state(s) of shapes {stored_shapes}, not the model's "
                                 f"{shapes}")
        torch_states = {}
        if progress.get("torch_rng_states") and keras.backend.backend() == "torch":
            with np.load(os.path.join(folder, TORCH_RNG_FILE), allow_pickle=False) as stored:
                torch_states = {name: stored[name] for name in progress["torch_rng_states"]}
        return python_state, array_state, seeds, torch_states

    def _save_model(self):
        progress = {"epoch": self._current_epoch, "batch": self._last_batch_seen}
        name = f"{PREFIX}{self._current_epoch:05d}-{self._last_batch_seen:07d}"
        save_weights_backup(self.model, self.backup_dir, name, progress, self.max_to_keep,
                            write_extra=self._write_extra)
