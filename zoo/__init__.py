"""Backbones and assembled models."""
from zoo.backbones import small_convnet
from zoo.resnet12 import resnet12

__all__ = ["small_convnet", "resnet12"]
