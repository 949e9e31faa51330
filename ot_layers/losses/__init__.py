"""Keras losses of the zoo."""
from ot_layers.losses.hyperspherical import HypersphericalPullLoss
from ot_layers.losses.manifold import ManifoldProxyLoss

__all__ = ["HypersphericalPullLoss", "ManifoldProxyLoss"]
