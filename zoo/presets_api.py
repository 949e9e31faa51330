"""``zoo.build`` / ``zoo.load`` (first version: architectures from the registry, weights from package data)."""
import os

from zoo.models import image_classifier
from zoo.registry import PRESETS
from zoo.resnet import cifar_resnet

PRESETS_DIR = os.path.join(os.path.dirname(__file__), "presets")


def _check_name(name):
    if name not in PRESETS:
        raise ValueError(f"Unknown preset {name!r}; known presets: {sorted(PRESETS)}.")
    return PRESETS[name]


def build(name, l2=0.0):
    """The untrained architecture of preset ``name``."""
    spec = _check_name(name)
    depth = int(spec["backbone"].replace("resnet", ""))
    backbone = cifar_resnet(depth, spec["input_shape"], l2=l2, name="backbone")
    return image_classifier(backbone, spec["head"], spec["num_classes"], spec["pixel_mean"], spec["pixel_std"],
                            head_kwargs=spec["head_kwargs"], name=name)
