"""Callbacks that update layer state between epochs."""
from ot_layers.callbacks.gsp_prototype_init import GSPPrototypeInit

__all__ = ["GSPPrototypeInit"]
