"""Which run the training state in a run directory belongs to.

A preset's run (``otzoo train``, each recipe's ``train``) keeps in its directory what a killed run resumes from:
``backup/`` (``keras.callbacks.BackupAndRestore``), and for few-shot presets the pre-trained backbone and the
meta-training checkpoints. Resuming that state into a run by another recipe goes wrong without a sign: the
learning-rate schedule spans the whole run, so a backup made at epoch 18 of a 60-epoch run and resumed with 10
epochs trains nothing and writes a card for weights of another schedule, and one resumed with more epochs mixes two.

So a run records what it is in the directory's ``run.json`` (:func:`claim_run_directory`): the preset's name,
task, architecture, data and recipe after every override, and the options that change what is trained (the
training slice ``limit``, a tuned configuration's head parameters, a borrowed backbone), and what trains it and
writes its backup (``trainer``: ``model.fit`` with ``AtomicBackupAndRestore``, or ``training.distributed.fit``'s
multi-worker loop with ``TrainingCheckpoint``, whose backups the other cannot read). A run whose directory holds the
state of another run stops with :class:`ResumeMismatchError`, naming the fields that differ. State left by a run
from before runs were recorded is resumed, as before, with a printed line; so is a record from before the trainer
was recorded (its trainer is not compared). ``otzoo tune --resume`` checks
its search (``tuner/``) the same way (``training.tuning.search.tune``).
"""
import dataclasses
import json
import os

from training.distributed.checkpoints import write_text_atomically
from training.distributed.strategies import is_chief, multi_worker_started
from training.recipes.components import plain_value

RUN_FILE = "run.json"
# Every entry a run directory's training state can be kept in: a train run's Keras backup, an ``otzoo tune``
# search, a few-shot run's pre-trained backbone and meta-training checkpoints. A run that does not resume an entry
# still leaves another run's alone: it refuses the directory while the entry holds anything and ``run.json``
# records another run (whose record it would otherwise replace, leaving that state unresumable).
TRAINING_STATE = ("backup", "tuner", "pretrained_backbone.weights.h5", "meta_checkpoints")
# At most this many differing fields are named in the error; the rest are counted.
NAMED_DIFFERENCES = 4
_ABSENT = object()
# What trains a run and writes its backup/ (``run.json``'s ``trainer``): ``model.fit`` (``AtomicBackupAndRestore``:
# weights files and ``training_metadata.json``), or ``training.distributed.fit``'s own loop under
# ``MultiWorkerMirroredStrategy`` (``TrainingCheckpoint``: ``tf.train`` checkpoints and ``progress.json``).
MODEL_FIT, MULTI_WORKER_LOOP = "model.fit", "multi_worker_loop"
_TRAINER_WORDS = {MODEL_FIT: "model.fit (one process: otzoo train without --workers)",
                  MULTI_WORKER_LOOP: "the multi-worker loop (otzoo train --workers N, or a TF_CONFIG cluster)"}
_TRAINER_ADVICE = {MODEL_FIT: "resume it without --workers, as it began",
                   MULTI_WORKER_LOOP: "resume it with --workers N or under its TF_CONFIG cluster, as it began"}


class ResumeMismatchError(ValueError):
    """The run directory holds the training state of another run (another recipe, data, slice, head or trainer).

    ``out_dir``: the directory; ``state``: its entries that hold the state; ``differences``: one
    ``"field: X there, Y here"`` per differing field. ``otzoo`` prints :meth:`option_message`, naming ``--out``.
    """

    def __init__(self, out_dir, state, differences):
        self.out_dir, self.state, self.differences = out_dir, list(state), list(differences)
        named = "; ".join(self.differences[:NAMED_DIFFERENCES])
        more = len(self.differences) - NAMED_DIFFERENCES
        if more > 0:
            named += f"; and {more} more"
        self.detail = (f"{out_dir} holds the training state ({', '.join(self.state)}) of another run ({named}); "
                       "continue it with the options it was started with, or train into another directory (or "
                       "remove that state to start afresh)")
        super().__init__(f"`out_dir` {self.detail}")

    def option_message(self, option="--out"):
        """The message with the directory named as the command-line option ``option``."""
        return f"{option} {self.detail}"


def run_identity(spec, trainer=None, **options):
    """What a run of preset spec ``spec`` (a ``zoo.spec.PresetSpec``, every override applied) trains: its name,
    task, architecture, data and recipe, and ``options`` (JSON values that also change the run, e.g. ``limit``),
    and ``trainer``, what trains it and writes its backup (:data:`MODEL_FIT` or :data:`MULTI_WORKER_LOOP`; default
    :func:`current_trainer`). The card's description is left out (words, not training). Returned as read back from
    ``run.json`` (a NumPy scalar among the values, e.g. a ``limit`` of ``np.int64(256)``, as the Python number it
    holds)."""
    identity = dict(name=spec.name, task=spec.task, architecture=dataclasses.asdict(spec.architecture),
                    data=dataclasses.asdict(spec.data), recipe=dataclasses.asdict(spec.recipe), options=options,
                    trainer=current_trainer() if trainer is None else trainer)
    return json.loads(json.dumps(plain_value(identity)))  # tuples become lists, as in the file


def current_trainer():
    """What ``training.distributed.fit`` trains this process's runs with: :data:`MULTI_WORKER_LOOP` once the
    process has made its ``MultiWorkerMirroredStrategy`` (a recipe makes its strategy before it records its run, and
    builds its model under it), else :data:`MODEL_FIT`."""
    return MULTI_WORKER_LOOP if multi_worker_started() else MODEL_FIT


def trainer_mismatch(recorded, trainer):
    """``None`` when the run ``recorded`` (a ``run.json`` dict, or ``None``) was trained by ``trainer``, or records
    no trainer (a run of an earlier otzoo: resumed as before); else a sentence saying so and how to resume it."""
    there = recorded.get("trainer") if isinstance(recorded, dict) else None
    if there is None or there == trainer:
        return None
    advice = _TRAINER_ADVICE.get(there, "resume it as it began")
    return (f"its backup was written by {_TRAINER_WORDS.get(there, repr(there))}, which this run, trained by "
            f"{_TRAINER_WORDS.get(trainer, repr(trainer))}, cannot read; {advice}, or train into another --out")


def _compared(recorded, run):
    """``run`` as compared with the ``recorded`` one: without its ``trainer`` when the record has none (a record of
    an earlier otzoo, whose runs are resumed as before)."""
    if isinstance(recorded, dict) and "trainer" not in recorded:
        return {key: value for key, value in run.items() if key != "trainer"}
    return run


def claim_run_directory(out_dir, run, state=("backup",), restarts=()):
    """Make ``out_dir`` the directory of run ``run`` (:func:`run_identity`): created if needed, and ``run.json``
    written (by the chief of several workers). Call it once the run's input is checked, right before its work: a
    run refused earlier leaves the directory as it was.

    ``state``: the entries of ``out_dir`` the run resumes from; ``restarts``: those it starts over (``otzoo tune
    --overwrite``: its ``tuner``; the command refuses one without ``--resume`` or ``--overwrite``). When an entry of
    ``state`` or of :data:`TRAINING_STATE` (but not of ``restarts``) holds anything and ``run.json`` records another
    run, raise :class:`ResumeMismatchError` and change nothing."""
    record = os.path.join(out_dir, RUN_FILE)
    recorded = read_mark(record)
    own = held_state(out_dir, state)
    others = held_state(out_dir, [name for name in TRAINING_STATE if name not in state and name not in restarts])
    present = own + others
    if recorded is not None and present and recorded != _compared(recorded, run):
        found = differences(recorded, _compared(recorded, run))
        if isinstance(recorded, dict) and "trainer" in recorded:  # how to resume it: with or without --workers
            advice = _TRAINER_ADVICE.get(recorded["trainer"], "resume it as it began")
            found = [f"{item} ({advice})" if item.startswith("trainer:") else item for item in found]
        raise ResumeMismatchError(out_dir, present, found)
    if recorded is None and own:
        print(f"{out_dir}: resuming {', '.join(own)}, whose run is not recorded (it began before runs "
              f"recorded themselves in {RUN_FILE})", flush=True)
    if present and not (isinstance(recorded, dict) and "trainer" in recorded):
        # state of a run that did not record its trainer: still unknown (the backup's reader names a wrong one)
        run = {key: value for key, value in run.items() if key != "trainer"}
    os.makedirs(out_dir, exist_ok=True)
    if is_chief():
        write_text_atomically(record, json.dumps(run, indent=1))


def differences(recorded, current, prefix=""):
    """``"field: X there, Y here"`` for every leaf where the nested dicts ``recorded`` and ``current`` differ
    (dotted field names; a field one side lacks shows as ``absent``)."""
    found = []
    for key in sorted(set(recorded) | set(current), key=str):
        name, old, new = f"{prefix}{key}", recorded.get(key, _ABSENT), current.get(key, _ABSENT)
        if isinstance(old, dict) and isinstance(new, dict):
            found += differences(old, new, f"{name}.")
        elif old != new:
            found.append(f"{name}: {_shown(old)} there, {_shown(new)} here")
    return found


def _shown(value):
    return "absent" if value is _ABSENT else json.dumps(value)


def held_state(out_dir, names=TRAINING_STATE):
    """The entries of ``names`` that hold anything in ``out_dir`` (a file, or a directory with something in it)."""
    return [name for name in names if _holds_anything(os.path.join(out_dir, name))]


def _holds_anything(path):
    if os.path.isdir(path):
        return bool(os.listdir(path))
    return os.path.exists(path)


def read_mark(path):
    """The JSON mark at ``path`` (``run.json``, or a caller's own record of a run), or ``None`` when there is no
    readable one."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None
