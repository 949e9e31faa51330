"""Shared set-up of the Fashion-MNIST zero-shot retrieval experiments (train on classes 0-4, test on 5-9)."""
import keras

import zoo
from training.data.fashion_mnist import load_fashion_mnist
from training.data.splits import select_classes
from training.evaluation.retrieval import retrieval_metrics
from zoo_inputs import small_convnet_options

TRAIN_CLASSES, TEST_CLASSES = (0, 1, 2, 3, 4), (5, 6, 7, 8, 9)


def zero_shot_data(train_limit, val_size=0):
    """Training images of classes 0-4 from the first ``train_limit`` training images (labels 0..4), ``val_size``
    validation images of the same classes from the images after them, and the test images of classes 5-9."""
    x, y = load_fashion_mnist("train", limit=train_limit + 2 * val_size)
    x_train, y_train = select_classes(x[:train_limit], y[:train_limit], TRAIN_CLASSES)
    x_val, y_val = select_classes(x[train_limit:], y[train_limit:], TRAIN_CLASSES)
    x_test, y_test = load_fashion_mnist("test")
    x_test, y_test = select_classes(x_test, y_test, TEST_CLASSES)
    return (x_train, y_train), (x_val[:val_size], y_val[:val_size]), (x_test, y_test)


def embedding_network(dim, width=16, name="embedding"):
    """``zoo.embedding_model``: small_convnet (BatchNorm momentum 0.9 for short runs) + global average pooling +
    Dense(dim) + L2 normalization, on unnormalized images (``zoo_inputs.RAW_PIXELS``).

    The published runs' network had no final L2 normalization; every consumer here normalizes its input anyway
    (``ClassProxies``, ``ManifoldProxies``, ``HardProxyUpdate``, ``CCPReinitialization``, the ensemble, cosine
    retrieval), so the normalization changes no result beyond float rounding."""
    return zoo.embedding_model("small_convnet", "gap", dim, name=name, **small_convnet_options(width))


def retrieval(model, images, labels):
    """MAP@R, R@1 and NMI of ``model``'s embeddings (cosine)."""
    embeddings = model.predict(images, batch_size=512, verbose=0)
    metrics = retrieval_metrics(embeddings, labels, ks=(1,), metric="cosine", nmi=True)
    return {k: round(float(v), 4) for k, v in metrics.items()}


def seed_everything(seed):
    keras.utils.set_random_seed(seed)
