"""Keras callbacks that change layer state between epochs (state kept in layer variables).

Every callback names the layer it drives with ``layer_name`` (``None``: the only layer of the expected class),
resolved by :func:`find_layer` (``ot_layers.tensor_ops.find_layer``, re-exported here).
"""
from ot_layers.callbacks.ccp import CCPReinitialization, remove_ccp_state
from ot_layers.callbacks.gsp_prototype_init import GSPPrototypeInit
from ot_layers.callbacks.hard_proxies import HardProxyUpdate
from ot_layers.callbacks.prototype_reassignment import PrototypeReassignment
from ot_layers.tensor_ops import find_layer

__all__ = ["GSPPrototypeInit", "PrototypeReassignment", "HardProxyUpdate", "CCPReinitialization", "remove_ccp_state",
           "find_layer"]
