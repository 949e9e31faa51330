"""Optimal-transport and prototype layers for Keras 3 (TensorFlow backend)."""
from ot_layers import losses, solvers
from ot_layers.layers import ClassProxies, GeneralizedSumPooling, MultiProxyWasserstein, SinkhornMatch

__all__ = ["solvers", "losses", "SinkhornMatch", "MultiProxyWasserstein", "ClassProxies", "GeneralizedSumPooling"]
