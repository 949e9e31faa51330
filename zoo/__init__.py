"""Backbones and assembled models."""
from zoo.backbones import small_convnet
from zoo.edms import ensemble_embedding_model, meta_class_partitions

__all__ = ["small_convnet", "meta_class_partitions", "ensemble_embedding_model"]
