"""PrototypeReassignment: the per-epoch Hungarian label-to-prototype re-assignment of DL2PA (Saadabadi et al. 2024)."""
import keras
import numpy as np

from ot_layers.layers.hyperspherical_prototypes import HypersphericalPrototypes
from ot_layers.solvers.assignment import hungarian_assignment
from ot_layers.tensor_ops import find_layer, normalize_rows_np
from ot_layers.validation import check_non_negative_int, check_positive_int

__all__ = ["PrototypeReassignment", "find_layer"]  # find_layer: kept importable from here for older imports


class PrototypeReassignment(keras.callbacks.Callback):
    """Every ``frequency`` epochs, set the layer's ``assignment`` to the bijection ``sigma`` maximizing
    ``sum_k cos(c_k, p_{sigma(k)})`` over the class representatives ``c_k`` and prototypes ``p_j`` (Saadabadi et al.
    2024, Sec. 3.2.3, Eq. 9; Hungarian algorithm via ``scipy.optimize.linear_sum_assignment``).

    ``layer_name``: the ``HypersphericalPrototypes`` layer to drive, or ``None`` for the only one in the model
    (``ot_layers.tensor_ops.find_layer``). The decision lives in the layer's variables (``assignment``, computed
    from ``representatives`` and ``prototypes`` only), so checkpoints, ``.keras`` files and
    ``keras.callbacks.BackupAndRestore`` carry it. The assignment is a deterministic function of the saved
    variables, and at the first epoch of every ``fit`` that resumes at a re-assignment epoch it is recomputed, so a
    resumed run equals an uninterrupted one whichever order this callback and ``BackupAndRestore`` /
    ``ModelCheckpoint`` have in the callback list. Adds ``prototype_changes`` (how many classes changed prototype
    in that epoch) to the epoch logs; ``changes`` keeps them for the epochs this object saw (a log, not state).
    ``batch_frequency``: also re-assign every that many training batches within an epoch (the paper re-assigns
    once per epoch; on short runs an early re-assignment, before the features commit to the initial map, is what
    lets the assignment matter). Counted in batches of the epoch: with ``compile(steps_per_execution=n)`` Keras
    reports only the last batch of each execution, and a re-assignment is made after the first execution that
    reaches each multiple of ``batch_frequency`` (one, if an execution passes several).
    """

    def __init__(self, layer_name=None, frequency=1, batch_frequency=None, verbose=0):
        super().__init__()
        self.layer_name = layer_name
        self.frequency = check_positive_int("frequency", frequency)
        self.batch_frequency = None if batch_frequency is None else check_positive_int("batch_frequency",
                                                                                         batch_frequency)
        self.verbose = int(verbose) if isinstance(verbose, bool) else check_non_negative_int("verbose", verbose)
        self.changes = []
        self._pending = 0
        self._first_epoch = True
        self._batch_reassignments = 0  # in-epoch re-assignments made this epoch

    def reassign(self, layer):
        """Recompute ``sigma`` for ``layer`` and store it; returns how many classes changed prototype."""
        raw = np.asarray(layer.representatives, dtype=np.float64)
        if not np.any(raw):
            raise ValueError(
                f"PrototypeReassignment: layer {layer.name!r} has received no labels (its class representatives are "
                "all zero), so there is nothing to re-assign from: train the model whose inputs are [images, labels] "
                "(zoo.hyperspherical_training_model), with labels in 0..num_classes-1.")
        representatives = normalize_rows_np(raw)
        similarity = representatives @ np.asarray(layer.prototypes, dtype=np.float64).T
        new = hungarian_assignment(similarity).astype(np.int32)
        old = np.asarray(layer.assignment)
        layer.assignment.assign(new)
        return int(np.sum(new != old))

    def _layer(self):
        return find_layer(self.model, HypersphericalPrototypes, self.layer_name)

    def on_train_begin(self, logs=None):
        self._layer()  # a model without the layer fails here, not after its first epoch
        self._first_epoch = True
        self._pending = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._batch_reassignments = 0
        if self._first_epoch:
            self._first_epoch = False
            layer = self._layer()
            if epoch > 0 and epoch % self.frequency == 0 and np.any(np.asarray(layer.representatives)):
                # resuming after a re-assignment epoch: redo it from the restored variables (idempotent), in case
                # the backup was written before this callback's on_epoch_end ran. A layer that has seen no labels
                # yet (a first fit started at initial_epoch > 0) has nothing to redo.
                self.reassign(layer)

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the last batch of the execution: with steps_per_execution > 1 a multiple of batch_frequency
        # may fall inside it, so compare counts rather than test (batch + 1) % batch_frequency
        if self.batch_frequency is not None and (batch + 1) // self.batch_frequency > self._batch_reassignments:
            self._batch_reassignments = (batch + 1) // self.batch_frequency
            self._pending += self.reassign(self._layer())

    def on_epoch_end(self, epoch, logs=None):
        changed, self._pending = self._pending, 0
        if (epoch + 1) % self.frequency == 0:
            changed += self.reassign(self._layer())
        self.changes.append(changed)
        if logs is not None:
            logs["prototype_changes"] = changed
        if self.verbose:
            print(f"\nEpoch {epoch + 1}: {changed} classes changed prototype.")
