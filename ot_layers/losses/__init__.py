"""Losses: metric learning (GSP's baselines) and GSP's zero-shot regularizer."""
from ot_layers.losses.metric_learning import (ContrastiveLoss, MultiSimilarityLoss, ProxyAnchorLoss,
                                              ProxyNCAPlusPlusLoss, TripletLoss)

__all__ = ["ContrastiveLoss", "TripletLoss", "MultiSimilarityLoss", "ProxyNCAPlusPlusLoss", "ProxyAnchorLoss"]
