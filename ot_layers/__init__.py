"""Optimal-transport and prototype layers for Keras 3 (TensorFlow backend)."""
from ot_layers import solvers
from ot_layers.layers import EMDHead, MultiProxyWasserstein, PatchExtractor, SinkhornMatch, StructuredFC

__all__ = ["EMDHead", "solvers", "SinkhornMatch", "MultiProxyWasserstein", "StructuredFC", "PatchExtractor"]
