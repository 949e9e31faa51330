"""The layers' own signals as epoch logs (so ``CSVLogger``, ``TensorBoard`` and the progress bar show them).

``LayerSignals(probe_images)`` adds at each epoch end, for the layers the model holds:

- ``<layer>_sinkhorn_iterations``, ``<layer>_marginal_error``: for each ``MultiProxyWasserstein`` head, the Sinkhorn
  iterations its matcher used on the probe images' feature maps (one batch, inference mode) and the mean final
  row-marginal error (the solver stops at ``threshold`` or ``max_iter``);
- ``ccp_reinitializations``: the CCP re-initialization rounds so far (``model.ccp_state``,
  ``ot_layers.callbacks.CCPReinitialization``);
- ``<layer>_prototypes_initialized``: whether a ``GeneralizedSumPooling`` layer's k-center initialization ran
  (``ot_layers.callbacks.GSPPrototypeInit``).

The hyperspherical re-assignments are logged by ``PrototypeReassignment`` itself (``prototype_changes``). Put this
callback before ``TensorBoard``/``CSVLogger`` in the list: Keras passes one ``logs`` dict along the callbacks in order.
"""
import keras
import numpy as np
from keras import ops

from ot_layers.layers.generalized_sum_pooling import GeneralizedSumPooling
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.tensor_ops import flatten_feature_map, walk_layers


class LayerSignals(keras.callbacks.Callback):
    """Adds the layers' signals (see the module docstring) to each epoch's logs. ``probe_images``: a small batch of
    model inputs (e.g. 64 training images) on which the Sinkhorn heads are run."""

    def __init__(self, probe_images):
        super().__init__()
        probe = np.asarray(probe_images)
        if probe.ndim < 2 or len(probe) == 0:
            raise ValueError(f"`probe_images` must be a non-empty batch of model inputs, got shape {probe.shape}.")
        self.probe = probe

    def signals(self):
        """``{name: float}`` for the model's layers now."""
        found = {}
        for layer in walk_layers(self.model):
            if isinstance(layer, MultiProxyWasserstein):
                features = keras.Model(self.model.inputs[0], layer.input)(self.probe, training=False)
                _, _, result = layer.matcher.match(flatten_feature_map(ops.convert_to_tensor(features)),
                                                   layer.proxies)
                found[f"{layer.name}_sinkhorn_iterations"] = float(np.max(keras.ops.convert_to_numpy(result.iterations)))
                found[f"{layer.name}_marginal_error"] = float(ops.convert_to_numpy(ops.mean(result.error)))
            elif isinstance(layer, GeneralizedSumPooling):
                found[f"{layer.name}_prototypes_initialized"] = float(np.asarray(layer.prototypes_initialized))
        state = getattr(self.model, "ccp_state", None)
        if state is not None:
            found["ccp_reinitializations"] = float(np.asarray(state.reinitializations))
        return found

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.signals())
