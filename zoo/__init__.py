"""Backbones and assembled models."""
from zoo.backbones import small_convnet
from zoo.classifiers import build_classifier

__all__ = ["small_convnet", "build_classifier"]
