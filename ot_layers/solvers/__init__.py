"""Pure tensor solvers (no Keras state). Each returns a small named result."""
from ot_layers.solvers.emd import EMDResult, emd
from ot_layers.solvers.k_center import greedy_k_center
from ot_layers.solvers.sinkhorn import SinkhornResult, sinkhorn

__all__ = ["sinkhorn", "SinkhornResult", "greedy_k_center", "emd", "EMDResult"]
