"""Optimal-transport and prototype layers for Keras 3 (TensorFlow backend)."""
from ot_layers import callbacks, losses, solvers
from ot_layers.layers import HypersphericalPrototypes
from ot_layers.layers import ManifoldProxies
from ot_layers.layers import MultiProxyWasserstein, SinkhornMatch

__all__ = ["solvers", "losses", "callbacks", "HypersphericalPrototypes", "ManifoldProxies", "SinkhornMatch", "MultiProxyWasserstein"]
