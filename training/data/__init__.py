"""Data: Fashion-MNIST from its IDX files, the TFDS data sets by name, class splits, class-balanced batches,
N-way K-shot episodes and cluttered canvases."""
from training.data.clutter import ClutteredImages, clutter
from training.data.episodes import EpisodeBatches, EpisodeSampler, episode_dataset
from training.data.fashion_mnist import fashion_mnist_dir, fashion_mnist_split, load_fashion_mnist
from training.data.pipelines import image_dataset, pad_crop_flip
from training.data.samplers import ClassBalancedBatches, class_balanced_indices
from training.data.splits import CLASS_SPLITS, PROTOCOLS, class_split, protocol_split, select_classes
from training.data.tfds import TFDS_DATASETS, tfds_dataset, tfds_split_dataset

__all__ = ["ClutteredImages", "clutter", "EpisodeBatches", "EpisodeSampler", "episode_dataset", "fashion_mnist_dir",
           "fashion_mnist_split", "load_fashion_mnist", "image_dataset", "pad_crop_flip", "ClassBalancedBatches",
           "class_balanced_indices", "CLASS_SPLITS", "PROTOCOLS", "class_split", "protocol_split", "select_classes",
           "TFDS_DATASETS", "tfds_dataset", "tfds_split_dataset"]
