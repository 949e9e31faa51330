"""``tf.data`` pipelines of in-memory image arrays, with the pad-crop-flip augmentation (or none), the choice
between them and ``training.data.arrays.ArrayBatches`` by backend (:func:`array_batches`), and a model's outputs
over such batches on any number of replicas (:func:`predict_batches`)."""
import keras
import numpy as np

from ot_layers.optional import tensorflow_if_installed
from ot_layers.padded_predict import drop_padding, pad_rows, padding_rows, replica_count
from training.data.arrays import ArrayBatches, check_augmentation, check_batching

tf = tensorflow_if_installed("tf.data pipelines")


def pad_crop_flip(image, pad, seed):
    """Zero-pad ``pad`` pixels on each side, crop back to the original size at a random place, flip left-right
    with probability 1/2 (the CIFAR augmentation of He et al. 2016). ``seed``: a stateless seed ``(2,)``."""
    height, width = image.shape[0], image.shape[1]
    padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    cropped = tf.image.stateless_random_crop(padded, [height, width, image.shape[2]], seed=crop_seed)
    return tf.image.stateless_random_flip_left_right(cropped, seed=flip_seed)


def image_dataset(images, labels, batch_size, training=False, pad=2, seed=0, drop_remainder=None,
                  augment="pad_crop_flip"):
    """Batches of ``(float32 pixels in 0-255, int32 labels)`` from arrays ``(N, H, W, C)``, ``(N,)``.

    With ``training``: shuffled and augmented anew every epoch (seeded), by ``augment`` (one of :data:`AUGMENTATIONS`:
    :func:`pad_crop_flip` with ``pad`` pixels (``pad=0``: flips only), or ``"none"``: the images as they are), the
    last incomplete batch dropped unless ``drop_remainder=False``. Pixels stay in 0-255: zoo models normalize them
    inside.
    """
    augment = check_augmentation(augment)
    batch_size, training, pad, seed, drop = check_batching(images, labels, batch_size, training, pad, seed,
                                                           drop_remainder)
    data = tf.data.Dataset.from_tensor_slices((images, labels))
    cast = lambda x, y: (tf.cast(x, tf.float32), tf.cast(y, tf.int32))  # noqa: E731
    if not training:
        return data.batch(batch_size, drop_remainder=drop).map(cast).prefetch(tf.data.AUTOTUNE)
    data = data.shuffle(len(images), seed=seed, reshuffle_each_iteration=True)
    # rerandomize_each_iteration: new draws every epoch (still a function of the seed); without it every epoch
    # repeated the first one's, so position j of each pass got the same crop and flip
    counter = tf.data.Dataset.random(seed=seed + 1, rerandomize_each_iteration=True).map(
        lambda s: tf.stack([s, s // 7 + 1]))
    data = tf.data.Dataset.zip((data, counter))
    if augment == "pad_crop_flip":
        transform = lambda xy, s: (pad_crop_flip(tf.cast(xy[0], tf.float32), pad, s), tf.cast(xy[1], tf.int32))  # noqa
    else:
        transform = lambda xy, s: (tf.cast(xy[0], tf.float32), tf.cast(xy[1], tf.int32))  # noqa: E731
    data = data.map(transform, num_parallel_calls=tf.data.AUTOTUNE)
    return data.batch(batch_size, drop_remainder=drop).prefetch(tf.data.AUTOTUNE)


def array_batches(images, labels, batch_size, training=False, pad=2, seed=0, drop_remainder=None,
                  augment="pad_crop_flip"):
    """The batches of in-memory arrays a recipe reads on the active Keras backend: :func:`image_dataset` (``tf.data``)
    on TensorFlow, ``training.data.arrays.ArrayBatches`` (NumPy) on JAX and PyTorch; same arguments and batches."""
    if keras.backend.backend() == "tensorflow":
        return image_dataset(images, labels, batch_size, training=training, pad=pad, seed=seed,
                             drop_remainder=drop_remainder, augment=augment)
    return ArrayBatches(images, labels, batch_size, training=training, pad=pad, seed=seed,
                        drop_remainder=drop_remainder, augment=augment)


def batch_labels(batches):
    """The labels of ``(images, labels)`` batches (a ``tf.data`` pipeline or ``ArrayBatches``), concatenated."""
    return np.concatenate(_labels_by_batch(batches))


def _labels_by_batch(batches):
    return [np.asarray(labels) for labels in batches.map(lambda x, y: y)]


def _pad_images(images, replicas):
    """A ``tf.data`` batch of ``images`` padded to a multiple of ``replicas`` rows with copies of its last image
    (``ot_layers.padded_predict.pad_rows`` in graph operations)."""
    missing = tf.math.floormod(-tf.shape(images)[0], replicas)
    return tf.concat([images, tf.repeat(images[-1:], missing, axis=0)], axis=0)


def predict_batches(model, batches):
    """``(outputs, labels)``: ``model.predict`` over the images of ``(images, labels)`` batches (a ``tf.data``
    pipeline or ``ArrayBatches``, read in a fixed order: an evaluation pipeline), and their labels.

    On several replicas (``ot_layers.padded_predict.replica_count``: a model built under a ``tf.distribute``
    strategy, JAX's ``DataParallel``) each batch is padded to a multiple of the replicas with copies of its last
    image, whose outputs are dropped: a last batch smaller than the replicas would leave one an empty batch (on
    CPUs oneDNN's convolution then fails) or one JAX's devices cannot split. On one replica it is
    ``model.predict(batches.map(lambda x, y: x))``."""
    labels = _labels_by_batch(batches)
    replicas = replica_count(model)
    if replicas == 1 or not any(padding_rows(len(batch), replicas) for batch in labels):
        outputs = model.predict(batches.map(lambda x, y: x), verbose=0)
    else:
        pad = pad_rows if isinstance(batches, ArrayBatches) else _pad_images
        outputs = model.predict(batches.map(lambda x, y: pad(x, replicas)), verbose=0)
        outputs = drop_padding(outputs, [len(batch) for batch in labels], replicas)
    return outputs, np.concatenate(labels)
