"""Backbones and assembled models."""
from zoo.backbones import small_convnet
from zoo.classifiers import build_classifier
from zoo.edms import ensemble_embedding_model, meta_class_partitions
from zoo.resnet12 import resnet12

__all__ = ["small_convnet", "resnet12", "build_classifier", "meta_class_partitions", "ensemble_embedding_model"]
