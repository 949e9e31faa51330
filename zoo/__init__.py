"""Backbones and assembled models."""
from zoo.backbones import small_convnet
from zoo.classifiers import build_classifier
from zoo.resnet12 import resnet12

__all__ = ["small_convnet", "build_classifier", "resnet12"]
