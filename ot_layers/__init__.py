"""Optimal-transport and prototype layers for Keras 3 (TensorFlow backend)."""
from ot_layers import callbacks, losses, solvers
from ot_layers.layers.base import ExportableLayer
from ot_layers.layers import (ClassProxies, EMDHead, GeneralizedSumPooling, HypersphericalPrototypes,
                              ManifoldProxies, MultiProxyWasserstein, PatchExtractor, SinkhornMatch, StructuredFC)
from ot_layers.task_model import TaskModel

__all__ = ["solvers", "losses", "callbacks", "SinkhornMatch", "MultiProxyWasserstein", "ClassProxies",
           "GeneralizedSumPooling", "EMDHead", "StructuredFC", "PatchExtractor", "HypersphericalPrototypes",
           "ManifoldProxies", "ExportableLayer", "TaskModel"]
