"""Pure tensor solvers (no Keras state). Each returns a small named result."""
from ot_layers.solvers.k_center import greedy_k_center
from ot_layers.solvers.partial_transport import PartialTransportResult, partial_transport
from ot_layers.solvers.sinkhorn import SinkhornResult, sinkhorn

__all__ = ["sinkhorn", "SinkhornResult", "greedy_k_center", "partial_transport", "PartialTransportResult"]
