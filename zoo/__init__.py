"""The zoo: backbones, assembled models and pretrained presets.

``zoo.list_models()``, ``zoo.model_card(name)``, ``zoo.load(name)`` (pretrained, offline) and ``zoo.build(name)``.
"""
from ot_layers.layers.task_layers import L2Normalization, PrototypeLogits, SplitEpisode, SupportClassMeans
from zoo.backbones import BACKBONES, backbone, small_convnet
from zoo.edms import ensemble_embedding_model, meta_class_partitions
from zoo.inputs import check_input_shape
from zoo.loading import build, list_models, load, model_card, preset_dir, save_preset
from zoo.preset_format import MissingWeightsError, WeightsDownloadError, WeightsIntegrityError
from zoo.models import (
                        CLASSIFICATION_HEADS,
                        hyperspherical_inference_model,
                        hyperspherical_training_model,
                        image_classifier,
                        pixel_preprocessing,
)
from zoo.resnet import cifar_resnet, resnet20, resnet32, resnet56
from zoo.resnet12 import resnet12
from zoo.tasks import FEW_SHOT_HEADS, RETRIEVAL_POOLINGS, embedding_model, few_shot_model, proxy_training_model

__all__ = ["list_models", "model_card", "preset_dir", "build", "load", "save_preset", "WeightsIntegrityError",
           "MissingWeightsError", "WeightsDownloadError",
           "image_classifier",
           "pixel_preprocessing",
           "CLASSIFICATION_HEADS", "hyperspherical_training_model", "hyperspherical_inference_model",
           "embedding_model", "proxy_training_model", "few_shot_model", "RETRIEVAL_POOLINGS", "FEW_SHOT_HEADS",
           "L2Normalization", "SupportClassMeans", "PrototypeLogits", "SplitEpisode",
           "backbone", "BACKBONES", "check_input_shape", "cifar_resnet", "resnet20", "resnet32", "resnet56",
           "resnet12", "small_convnet", "meta_class_partitions", "ensemble_embedding_model"]
