"""The zoo: backbones, assembled models and pretrained presets.

``zoo.list_models()``, ``zoo.model_card(name)``, ``zoo.load(name)`` (pretrained, offline) and ``zoo.build(name)``.
"""
from zoo.backbones import BACKBONES, backbone, check_input_shape, small_convnet
from zoo.classifiers import build_classifier
from zoo.edms import ensemble_embedding_model, meta_class_partitions
from zoo.loading import build, list_models, load, model_card, save_preset
from zoo.models import image_classifier, pixel_preprocessing
from zoo.resnet import cifar_resnet, resnet20, resnet32, resnet56
from zoo.resnet12 import resnet12

__all__ = ["list_models", "model_card", "build", "load", "save_preset", "image_classifier", "pixel_preprocessing",
           "backbone", "BACKBONES", "check_input_shape", "cifar_resnet", "resnet20", "resnet32", "resnet56",
           "resnet12", "small_convnet", "build_classifier", "meta_class_partitions", "ensemble_embedding_model"]
