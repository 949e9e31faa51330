"""Public Keras layers, one module each."""
from ot_layers.layers.emd_head import EMDHead
from ot_layers.layers.local_embeddings import PatchExtractor
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.layers.sinkhorn_match import SinkhornMatch
from ot_layers.layers.structured_fc import StructuredFC

__all__ = ["EMDHead", "SinkhornMatch", "MultiProxyWasserstein", "StructuredFC", "PatchExtractor"]
