"""Losses: metric learning (GSP's baselines), GSP's zero-shot regularizer, DL2PA's pull loss, EDMS' manifold
proxy loss."""
from ot_layers.losses.hyperspherical import HypersphericalPullLoss
from ot_layers.losses.manifold import ManifoldProxyLoss
from ot_layers.losses.metric_learning import (ContrastiveLoss, MultiSimilarityLoss, ProxyAnchorLoss,
                                              ProxyNCAPlusPlusLoss, TripletLoss)

__all__ = ["ContrastiveLoss", "TripletLoss", "MultiSimilarityLoss", "ProxyNCAPlusPlusLoss", "ProxyAnchorLoss",
           "HypersphericalPullLoss", "ManifoldProxyLoss"]
