"""Losses: metric learning (GSP's baselines) and GSP's zero-shot regularizer."""
from ot_layers.losses.metric_learning import (ContrastiveLoss, MultiSimilarityLoss, ProxyAnchorLoss, ProxyLoss,
                                              ProxyNCAPlusPlusLoss, TripletLoss)
from ot_layers.losses.zero_shot import ZERO_SHOT_WEIGHT, ZeroShotPredictionLoss

__all__ = ["ContrastiveLoss", "TripletLoss", "MultiSimilarityLoss", "ProxyLoss", "ProxyNCAPlusPlusLoss",
           "ProxyAnchorLoss", "ZeroShotPredictionLoss", "ZERO_SHOT_WEIGHT"]
