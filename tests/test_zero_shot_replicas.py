"""``ZeroShotPredictionLoss`` (Gurbuz 2022 thesis, Eq. 5.2.4) under a 2-replica ``MirroredStrategy`` (two logical
CPUs, created before TensorFlow starts by ``conftest.py``).

The loss returns its batch value as a scalar, and Keras divides a loss by the number of replicas only when it reduces
per-example values itself (``keras/src/losses/loss.py::reduce_values`` returns a scalar untouched) while the
replicas' gradients are summed: before the fix a 2-replica step applied twice the zero-shot gradient. The loss now
divides its scalar by the replicas (``ot_layers.losses.common.per_replica``, as the proxy and pair losses do).

``L_ZS`` depends on the composition of the batch (class halves and ridge maps within it), so a 2-replica step is not
a one-replica step on the whole batch: each replica computes ``L_ZS`` on its own half. The right reference (the one
``test_distributed_mirrored_heads.py`` asserts for the proxy and pair losses) is the mean over the replicas of the
one-replica gradients on each replica's half. With plain SGD that is the mean of the weights after one one-replica
step on each half.
"""
import keras
import numpy as np
import tensorflow as tf

from ot_layers import ClassProxies
from ot_layers.losses import ZeroShotPredictionLoss
from tests.keras_checks import two_replica_strategy

NUM_CLASSES, BATCH = 4, 16


def _build():
    """A model whose compiled loss holds a per-example loss and ``ZeroShotPredictionLoss`` (Eq. 5.2.5's sum)."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(8, activation="tanh", name="hidden")(inputs)
    logits = keras.layers.Dense(NUM_CLASSES, name="logits")(hidden)
    attributes = keras.layers.Dense(6, activation="softmax", name="attributes")(hidden)
    packed = ClassProxies(NUM_CLASSES, dim=5, output="packed", name="class_embeddings")(attributes)
    model = keras.Model(inputs, [logits, packed])
    model.compile(keras.optimizers.SGD(0.5),
                  [keras.losses.SparseCategoricalCrossentropy(from_logits=True), ZeroShotPredictionLoss()],
                  loss_weights=[0.5, 1.0])
    return model


def _data():
    """One global batch; each replica's half (the first and the last 8 samples) holds every class twice."""
    rng = np.random.default_rng(0)
    labels = np.concatenate([np.repeat(np.arange(NUM_CLASSES), 2), np.repeat(np.arange(NUM_CLASSES)[::-1], 2)])
    images = (rng.normal(size=(BATCH, 5)) + labels[:, None] * 0.5).astype(np.float32)
    return images, labels.astype(np.int32)


def _weights(model):
    return {w.path: np.asarray(w.value) for w in model.weights}


def _one_step(model, images, labels):
    model.fit(images, [labels, labels], batch_size=len(images), epochs=1, shuffle=False, verbose=0)
    return _weights(model)


def test_two_replica_step_with_the_zero_shot_loss_is_the_mean_of_the_replicas_one_replica_steps():
    assert len(tf.config.list_logical_devices("CPU")) >= 2  # conftest.py splits the CPU
    images, labels = _data()
    strategy = two_replica_strategy()  # no collective all-reduce between tests (see keras_checks)
    assert strategy.num_replicas_in_sync == 2
    with strategy.scope():
        mirrored = _build()
    initial = _weights(mirrored)
    found = _one_step(mirrored, images, labels)
    for weight in mirrored.weights:  # the two replica copies stay identical
        copies = strategy.experimental_local_results(weight.value)
        np.testing.assert_array_equal(np.asarray(copies[0]), np.asarray(copies[1]), err_msg=weight.path)

    halves = [_one_step(_build(), images[part], labels[part]) for part in (slice(0, 8), slice(8, 16))]
    expected = {key: (halves[0][key] + halves[1][key]) / 2.0 for key in halves[0]}
    assert sorted(found) == sorted(expected)
    class_embeddings = next(key for key in expected if key.startswith("class_embeddings"))
    # the zero-shot loss is the only one reaching the class embeddings: they moved, by a gradient larger than atol
    assert np.abs(expected[class_embeddings] - initial[class_embeddings]).max() > 1e-3
    for key, value in expected.items():
        np.testing.assert_allclose(found[key], value, rtol=0, atol=1e-5, err_msg=key)
