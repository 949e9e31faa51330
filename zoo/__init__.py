"""Backbones and assembled models."""
from zoo.backbones import small_convnet
from zoo.classifiers import build_classifier
from zoo.edms import ensemble_embedding_model, meta_class_partitions

__all__ = ["small_convnet", "build_classifier", "meta_class_partitions", "ensemble_embedding_model"]
