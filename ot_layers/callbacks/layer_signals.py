"""The layers' own signals as epoch logs (so ``CSVLogger``, ``TensorBoard`` and the progress bar show them).

``LayerSignals(probe_images)`` adds at each epoch end, for the layers the model holds:

- ``<layer>_sinkhorn_iterations``, ``<layer>_marginal_error``: for each ``MultiProxyWasserstein`` head, the Sinkhorn
  iterations its matcher used on the probe images' feature maps (one batch, inference mode) and the mean final
  row-marginal error (the solver stops at ``threshold`` or ``max_iter``);
- for each ``EMDHead`` (a few-shot model, probed with one episode's inputs): ``<layer>_marginal_error`` and
  ``<layer>_converged`` (the share of its query-class problems that met their threshold, or whose network simplex
  reported an optimal flow), and with ``method="sinkhorn"`` ``<layer>_sinkhorn_iterations``; a ``StructuredFC``
  reports its head's signals under its own name (the query feature maps it receives against its class nodes);
- ``ccp_reinitializations``: the CCP re-initialization rounds so far (``model.ccp_state``,
  ``ot_layers.callbacks.CCPReinitialization``);
- for each ``GeneralizedSumPooling`` layer: ``<layer>_transport_iterations`` and ``<layer>_marginal_error``, the
  partial transport's (Gürbüz 2022, Prop. 5.2.1; Newton's method) largest count of evaluations and mean final
  error on the probe images (each image stops at the layer's ``threshold`` or ``max_iter``; the transport runs
  during the GAP warm-up too), and ``<layer>_prototypes_initialized``, whether its k-center initialization ran
  (``ot_layers.callbacks.GSPPrototypeInit``).

The hyperspherical re-assignments are logged by ``PrototypeReassignment`` itself (``prototype_changes``). Put this
callback before ``TensorBoard``/``CSVLogger`` in the list: Keras passes one ``logs`` dict along the callbacks in order.
Episodic meta-training, which runs no callbacks, calls :meth:`LayerSignals.signals` itself
(``training.recipes.few_shot.meta_train``).
"""
import keras
import numpy as np
from keras import ops

from ot_layers.layers.emd_head import EMDHead
from ot_layers.layers.generalized_sum_pooling import GeneralizedSumPooling
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.layers.structured_fc import StructuredFC
from ot_layers.tensor_ops import flatten_feature_map, layer_input_model, walk_layers
from ot_layers.validation import check_fits_model_inputs


class LayerSignals(keras.callbacks.Callback):
    """Adds the layers' signals (see the module docstring) to each epoch's logs. ``probe_images``: a small batch of
    the model's first input (e.g. 64 training images) on which the Sinkhorn heads are run, or a list with a batch
    for every input of the model (a few-shot model: one episode's ``[query images, support images, support
    labels]``)."""

    def __init__(self, probe_images):
        super().__init__()
        if isinstance(probe_images, (list, tuple)):  # a batch for each input: labels are batches of scalars
            probe, lowest_rank = [np.asarray(part) for part in probe_images], 1
        else:
            probe, lowest_rank = np.asarray(probe_images), 2
        for part in probe if isinstance(probe, list) else [probe]:
            if part.ndim < lowest_rank or len(part) == 0:
                raise ValueError(f"`probe_images` must be a non-empty batch of model inputs, got shape {part.shape}.")
        self.probe = probe

    def _check_against_model(self):
        """Refuses a probe that does not fit the model's inputs, naming ``probe_images``, before any epoch runs
        (Keras' own error would come at the first epoch's end and name an internal sub-model)."""
        check_fits_model_inputs("probe_images", self.probe, self.model, first_input_only=True)

    def on_train_begin(self, logs=None):
        self._check_against_model()

    def _layer_inputs(self, layer):
        """What ``layer`` receives when the model runs on the probe (inference mode)."""
        inputs = self.model.inputs if isinstance(self.probe, list) else self.model.inputs[0]
        return layer_input_model(self.model, layer, inputs)(self.probe, training=False)

    def signals(self):
        """``{name: float}`` for the model's layers now."""
        self._check_against_model()
        found = {}
        layers = list(walk_layers(self.model))
        held = {id(layer.head) for layer in layers if isinstance(layer, StructuredFC)}  # called by it, not the graph
        for layer in layers:
            if isinstance(layer, MultiProxyWasserstein):
                features = self._layer_inputs(layer)
                _, _, result = layer.matcher.match(flatten_feature_map(ops.convert_to_tensor(features)),
                                                   layer.proxies)
                found[f"{layer.name}_sinkhorn_iterations"] = _largest(result.iterations)
                found[f"{layer.name}_marginal_error"] = _mean(result.error)
            elif isinstance(layer, EMDHead) and id(layer) not in held:
                query, support = self._layer_inputs(layer)
                found.update(_emd_signals(layer.name, layer, query, support))
            elif isinstance(layer, StructuredFC):
                found.update(_emd_signals(layer.name, layer.head, self._layer_inputs(layer), layer.nodes))
            elif isinstance(layer, GeneralizedSumPooling):
                result = layer.transport(layer.flat_features(self._layer_inputs(layer)))
                found[f"{layer.name}_transport_iterations"] = _largest(result.iterations)
                found[f"{layer.name}_marginal_error"] = _mean(result.error)
                found[f"{layer.name}_prototypes_initialized"] = float(np.asarray(layer.prototypes_initialized))
        state = getattr(self.model, "ccp_state", None)
        if state is not None:
            found["ccp_reinitializations"] = float(np.asarray(state.reinitializations))
        return found

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.signals())


def _emd_signals(name, head, query, support):
    """The signals of ``head``'s transport between ``query`` and ``support`` feature maps, named after ``name``."""
    result = head.transport(flatten_feature_map(ops.convert_to_tensor(query)),
                            flatten_feature_map(ops.convert_to_tensor(support)))[3]
    found = {}
    if head.method == "sinkhorn":
        found[f"{name}_sinkhorn_iterations"] = _largest(result.iterations)
    found[f"{name}_marginal_error"] = _mean(result.error)
    found[f"{name}_converged"] = _mean(ops.cast(result.converged, "float32"))
    return found


def _largest(values):
    return float(np.max(ops.convert_to_numpy(values)))


def _mean(values):
    return float(np.mean(ops.convert_to_numpy(values)))
