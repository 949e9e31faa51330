"""Optimal-transport and prototype layers for Keras 3 (TensorFlow backend)."""
from ot_layers import solvers
from ot_layers.layers import MultiProxyWasserstein, SinkhornMatch

__all__ = ["solvers", "SinkhornMatch", "MultiProxyWasserstein"]
