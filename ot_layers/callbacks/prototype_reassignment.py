"""PrototypeReassignment: the per-epoch Hungarian label-to-prototype re-assignment of DL2PA (paper 001, SPEC S6)."""
import keras
import numpy as np

from ot_layers.layers.hyperspherical_prototypes import HypersphericalPrototypes
from ot_layers.solvers.assignment import hungarian_assignment
from ot_layers.validation import check_positive_int


def find_layer(model, layer_class, layer_name=None):
    """The layer named ``layer_name`` (or else the only ``layer_class`` instance) in ``model``, searched
    recursively through nested models."""
    found = []

    def visit(layer):
        if isinstance(layer, layer_class) and (layer_name is None or layer.name == layer_name):
            found.append(layer)
        for child in getattr(layer, "layers", []):
            visit(child)

    visit(model)
    if len(found) != 1:
        what = f"named {layer_name!r}" if layer_name else "(pass `layer_name` to choose one)"
        raise ValueError(f"Expected exactly one {layer_class.__name__} layer {what} in the model, found {len(found)}.")
    return found[0]


class PrototypeReassignment(keras.callbacks.Callback):
    """Every ``frequency`` epochs, set the layer's ``assignment`` to the bijection ``sigma`` maximizing
    ``sum_k cos(c_k, p_{sigma(k)})`` over the class representatives ``c_k`` and prototypes ``p_j`` (paper 001,
    Sec. 3.2; Hungarian algorithm via ``scipy.optimize.linear_sum_assignment``).

    All state lives in the layer's variables (``assignment``, ``representatives``), so checkpoints and ``.keras``
    files carry it and a resumed run continues with the same assignment. Place this callback before
    ``keras.callbacks.ModelCheckpoint`` so that the checkpoint of an epoch holds that epoch's new assignment.
    Adds ``prototype_changes`` (how many classes changed prototype since the last epoch's logs) to the epoch
    logs; ``changes`` keeps the list. ``batch_frequency``: also re-assign every that many training batches within
    an epoch (the paper re-assigns once per epoch; on short runs an early re-assignment, before the features commit
    to the initial map, is what lets the assignment matter).
    """

    def __init__(self, layer_name=None, frequency=1, batch_frequency=None, verbose=0):
        super().__init__()
        self.layer_name = layer_name
        self.frequency = check_positive_int("frequency", frequency)
        self.batch_frequency = None if batch_frequency is None else check_positive_int("batch_frequency",
                                                                                         batch_frequency)
        self.verbose = int(verbose)
        self.changes = []
        self._pending = 0

    def reassign(self, layer):
        """Recompute ``sigma`` for ``layer`` and store it; returns how many classes changed prototype."""
        representatives = np.asarray(layer.representatives, dtype=np.float64)
        norms = np.linalg.norm(representatives, axis=1, keepdims=True)
        representatives = representatives / np.maximum(norms, 1e-12)
        similarity = representatives @ np.asarray(layer.prototypes, dtype=np.float64).T
        new = hungarian_assignment(similarity).astype(np.int32)
        old = np.asarray(layer.assignment)
        layer.assignment.assign(new)
        return int(np.sum(new != old))

    def _layer(self):
        return find_layer(self.model, HypersphericalPrototypes, self.layer_name)

    def on_train_batch_end(self, batch, logs=None):
        if self.batch_frequency is not None and (batch + 1) % self.batch_frequency == 0:
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
