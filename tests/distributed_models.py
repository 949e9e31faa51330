"""Small zoo models and data shared by the distributed, fault-tolerance and tuning tests (and their worker script).

The models use a BatchNorm-free backbone so that a step on N replicas of ``B / N`` examples is mathematically the
step of one process on the global batch of ``B`` (BatchNorm would normalize each replica's half batch with its own
statistics); every head of the zoo sits on it unchanged.
"""
import keras
import numpy as np
import tensorflow as tf

import zoo

NUM_CLASSES = 4
IMAGE_SHAPE = (12, 12, 1)


def plain_backbone(width=8):
    """Conv-ReLU x2 (strides 2): (12, 12, 1) -> a (3, 3, 2*width) feature map, no BatchNorm."""
    inputs = keras.Input(IMAGE_SHAPE, name="images")
    x = keras.layers.Conv2D(width, 3, strides=2, padding="same", activation="relu", name="conv0")(inputs)
    x = keras.layers.Conv2D(2 * width, 3, strides=2, padding="same", activation="relu", name="conv1")(x)
    return keras.Model(inputs, x, name="plain_backbone")


def synthetic_data(count=64, seed=0):
    """``count`` uint8-valued images (float32) of ``IMAGE_SHAPE`` and balanced labels ``0..NUM_CLASSES-1``,
    each class with its own mean brightness pattern (learnable in a few steps)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % NUM_CLASSES
    patterns = rng.uniform(0, 255, size=(NUM_CLASSES,) + IMAGE_SHAPE)
    images = np.clip(patterns[labels] + rng.normal(0, 40, size=(count,) + IMAGE_SHAPE), 0, 255)
    return images.astype(np.float32), labels.astype(np.int32)


def dataset(images, labels, batch_size, inputs="images"):
    """Global batches in a fixed order (no shuffle); ``inputs="images_labels"`` gives ``((x, y), y)`` for the
    hyperspherical training model."""
    if inputs == "images_labels":
        data = tf.data.Dataset.from_tensor_slices(((images, labels), labels))
    else:
        data = tf.data.Dataset.from_tensor_slices((images, labels))
    return data.batch(batch_size, drop_remainder=True)


def mpw_classifier(learning_rate=0.05, seed=0):
    """``zoo.image_classifier(plain_backbone, "mpw")``, compiled with SGD + momentum (optimizer state to carry).
    Sinkhorn runs exactly ``max_iter`` iterations (``threshold=0``): with a stopping test on the batch's error a
    replica's half batch could stop at another iteration than the whole batch."""
    keras.utils.set_random_seed(seed)
    model = zoo.image_classifier(plain_backbone(), "mpw", NUM_CLASSES, input_shape=IMAGE_SHAPE,
                                 head_kwargs={"num_proxies": 2, "epsilon": 0.2, "threshold": 0.0, "max_iter": 10})
    model.compile(keras.optimizers.SGD(learning_rate, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def hyperspherical_training(learning_rate=0.05, seed=0):
    """The hyperspherical classifier's training model (inputs ``[images, labels]``), HypersphericalPullLoss."""
    from ot_layers.losses import HypersphericalPullLoss

    keras.utils.set_random_seed(seed)
    classifier = zoo.image_classifier(plain_backbone(), "hyperspherical", NUM_CLASSES, input_shape=IMAGE_SHAPE,
                                      head_kwargs={"dim": 3})
    model = zoo.hyperspherical_training_model(classifier)
    model.compile(keras.optimizers.SGD(learning_rate, momentum=0.9), HypersphericalPullLoss())
    return model


def weights_by_path(model):
    """``{variable path: numpy value}`` for every model weight and optimizer variable (the optimizer's own name,
    which Keras numbers per process -- ``sgd``, ``sgd_1`` --, left out)."""
    values = {f"model/{w.path}": np.asarray(w) for w in model.weights}
    values.update({f"optimizer/{v.path.split('/', 1)[-1]}": np.asarray(v) for v in model.optimizer.variables})
    return values
