"""Losses: metric learning (GSP's baselines), GSP's zero-shot regularizer, DL2PA's pull loss, EDMS' manifold
proxy loss."""
from ot_layers.losses.hyperspherical import HypersphericalPullLoss
from ot_layers.losses.manifold import ManifoldProxyLoss
from ot_layers.losses.metric_learning import (
                                              ContrastiveLoss,
                                              MultiSimilarityLoss,
                                              ProxyAnchorLoss,
                                              ProxyLoss,
                                              ProxyNCAPlusPlusLoss,
                                              TripletLoss,
)
from ot_layers.losses.zero_shot import ZERO_SHOT_WEIGHT, ZeroShotPredictionLoss

__all__ = ["ContrastiveLoss", "TripletLoss", "MultiSimilarityLoss", "ProxyLoss", "ProxyNCAPlusPlusLoss",
           "ProxyAnchorLoss", "ZeroShotPredictionLoss", "ZERO_SHOT_WEIGHT", "HypersphericalPullLoss",
           "ManifoldProxyLoss"]
