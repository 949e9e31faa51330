"""Keras losses of the zoo."""
from ot_layers.losses.hyperspherical import HypersphericalPullLoss

__all__ = ["HypersphericalPullLoss"]
