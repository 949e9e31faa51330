"""Keras callbacks that change layer state between epochs (state kept in layer variables)."""
from ot_layers.callbacks.ccp import CCPReinitialization
from ot_layers.callbacks.gsp_prototype_init import GSPPrototypeInit
from ot_layers.callbacks.hard_proxies import HardProxyUpdate
from ot_layers.callbacks.prototype_reassignment import PrototypeReassignment

__all__ = ["GSPPrototypeInit", "PrototypeReassignment", "HardProxyUpdate", "CCPReinitialization"]
