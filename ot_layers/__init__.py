"""Optimal-transport and prototype layers for Keras 3 (TensorFlow backend)."""
from ot_layers import callbacks, losses, solvers
from ot_layers.layers import ClassProxies, GeneralizedSumPooling, MultiProxyWasserstein, SinkhornMatch
from ot_layers.layers import HypersphericalPrototypes, ManifoldProxies

__all__ = ["solvers", "losses", "callbacks", "SinkhornMatch", "MultiProxyWasserstein", "ClassProxies",
           "GeneralizedSumPooling", "HypersphericalPrototypes", "ManifoldProxies"]
