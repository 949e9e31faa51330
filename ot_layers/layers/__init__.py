"""Public Keras layers, one module each."""
from ot_layers.layers.class_proxies import ClassProxies
from ot_layers.layers.emd_head import EMDHead
from ot_layers.layers.generalized_sum_pooling import GeneralizedSumPooling
from ot_layers.layers.hyperspherical_prototypes import HypersphericalPrototypes
from ot_layers.layers.local_embeddings import PatchExtractor
from ot_layers.layers.manifold_proxies import ManifoldProxies
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.layers.sinkhorn_match import SinkhornMatch
from ot_layers.layers.structured_fc import StructuredFC

__all__ = ["SinkhornMatch", "MultiProxyWasserstein", "ClassProxies", "GeneralizedSumPooling", "EMDHead",
           "StructuredFC", "PatchExtractor", "HypersphericalPrototypes", "ManifoldProxies"]
