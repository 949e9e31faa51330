"""Seeing what the layers do: pictures of transport plans, pooling weights, EMD flows, prototypes, retrieval and
training curves, from a model in memory (``plot_*``, ``explain_model``) or a preset (``otzoo explain``).

``explain.signals`` pulls the quantities out of a model exactly as its layers compute them; ``explain.plots`` draws
them (matplotlib, Agg, PNG); ``explain.report.explain_model`` writes every picture that fits a model;
``otzoo.explain_command`` is the ``otzoo explain`` sub-command. See ``docs/explain.md``.
"""
from explain.images import load_image_file, prepare_images, upsample
from explain.plots import (
                           figure_pixels,
                           plot_emd_flows,
                           plot_gsp_weights,
                           plot_mpw_plans,
                           plot_prototypes,
                           plot_retrieval,
                           plot_training_curves,
)
from explain.report import KINDS, available_kinds, explain_model
from explain.signals import (
                           FASHION_MNIST_CLASSES,
                           AssignmentHistory,
                           emd_flows,
                           gsp_weights,
                           image_embeddings,
                           mpw_plans,
                           nearest_neighbours,
                           prototype_geometry,
                           read_training_log,
)

__all__ = ["plot_mpw_plans", "plot_gsp_weights", "plot_emd_flows", "plot_prototypes", "plot_retrieval",
           "plot_training_curves", "explain_model", "available_kinds", "KINDS", "figure_pixels", "mpw_plans",
           "gsp_weights", "emd_flows", "prototype_geometry", "image_embeddings", "nearest_neighbours",
           "read_training_log", "AssignmentHistory", "FASHION_MNIST_CLASSES", "load_image_file", "prepare_images",
           "upsample"]
