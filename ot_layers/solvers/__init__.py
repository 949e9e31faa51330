"""Pure tensor solvers (no Keras state). Each returns a small named result."""
from ot_layers.solvers.assignment import hungarian_assignment
from ot_layers.solvers.emd import EMDResult, emd
from ot_layers.solvers.k_center import greedy_k_center
from ot_layers.solvers.partial_transport import PartialTransportResult, partial_transport
from ot_layers.solvers.prototypes import estimate_prototypes, simplex_etf
from ot_layers.solvers.random_walk import random_walk_similarity
from ot_layers.solvers.sinkhorn import SinkhornResult, sinkhorn

__all__ = ["sinkhorn", "SinkhornResult", "emd", "EMDResult", "partial_transport", "PartialTransportResult",
           "greedy_k_center", "estimate_prototypes", "simplex_etf", "hungarian_assignment", "random_walk_similarity"]
