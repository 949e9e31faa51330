"""Public Keras layers, one module each."""
from ot_layers.layers.hyperspherical_prototypes import HypersphericalPrototypes
from ot_layers.layers.manifold_proxies import ManifoldProxies
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.layers.sinkhorn_match import SinkhornMatch

__all__ = ["SinkhornMatch", "MultiProxyWasserstein", "HypersphericalPrototypes", "ManifoldProxies"]
