"""Pure tensor solvers (no Keras state). Each returns a small named result."""
from ot_layers.solvers.sinkhorn import SinkhornResult, sinkhorn

__all__ = ["sinkhorn", "SinkhornResult"]
