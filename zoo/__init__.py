"""Backbones and assembled models."""
from zoo.backbones import small_convnet

__all__ = ["small_convnet"]
