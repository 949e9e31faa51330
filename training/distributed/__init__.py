"""Training under ``tf.distribute``: strategies by name, ``fit`` (``model.fit`` or the multi-worker loop),
checkpoints that survive a kill, and a launcher of local worker processes. These are TensorFlow features."""
from training.distributed.checkpoints import AtomicBackupAndRestore, TrainingCheckpoint
from training.distributed.fit import fit
from training.distributed.strategies import STRATEGIES, is_chief, make_strategy

__all__ = ["AtomicBackupAndRestore", "TrainingCheckpoint", "fit", "STRATEGIES", "is_chief", "make_strategy"]
