"""Fine-tuning DeepEMD's structured FC on a k-shot support set with the backbone frozen (Zhang et al. 2022, Sec.
4.5).

:func:`fine_tune_structured_fc` runs on every Keras backend: on TensorFlow through :func:`fine_tune_nodes` (pure
TensorFlow, so one ``tf.function`` serves every episode of an evaluation), on JAX and PyTorch through Keras' own
``fit`` of the layer (SGD with momentum, the same updates on mini-batches drawn by NumPy's generator, so the draws,
not the procedure, differ from TensorFlow's). :func:`class_mean_nodes` and :func:`fine_tune_nodes` are TensorFlow
code; :func:`fine_tune_nodes` takes a head on the TensorFlow backend only.
"""
import inspect
import weakref

import keras
import numpy as np

from ot_layers.optional import tensorflow_if_installed
from ot_layers.validation import check_in_range, check_positive, check_positive_int, check_seed

tf = tensorflow_if_installed("the structured FC evaluation")

STEPS = 100
BATCH_SIZE = 4  # this project's default; Zhang et al. 2022, Sec. 5.1, fine-tune on mini-batches of 5 images
LEARNING_RATE = 0.05
MOMENTUM = 0.9


def class_mean_nodes(support_features, support_label, ways):
    """The initial node sets: each class's mean support feature map, ``(ways, n, d)`` (TensorFlow tensors; on every
    backend ``StructuredFC.initialize_from_support`` sets them)."""
    return tf.stack([tf.reduce_mean(tf.boolean_mask(support_features, tf.equal(support_label, k)), axis=0)
                     for k in range(ways)])


def _check_settings(steps, batch_size, learning_rate, momentum, seed):
    """The fine-tuning settings, checked eagerly (inside tf.function an error comes as a long "in user code" trace);
    ``seed`` (the mini-batch draws') an integer >= 0 on every backend (NumPy's generator would take ``None`` as
    fresh entropy, an unrepeatable fine-tuning)."""
    check_seed("seed", seed)
    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    check_positive("learning_rate", learning_rate)
    check_in_range("momentum", momentum, 0.0, 1.0, high_open=True)  # 1 or more: the velocity grows without bound


def fine_tune_nodes(head, support_features, support_label, nodes, steps=STEPS, batch_size=BATCH_SIZE,
                    learning_rate=LEARNING_RATE, momentum=MOMENTUM, seed=0):
    """SGD with momentum on the node sets ``nodes`` ``(ways, n, d)``: cross-entropy of ``head``'s EMD logits on
    mini-batches of ``batch_size`` support samples (features ``(S, n, d)``, frozen), ``steps`` updates.

    Pure TensorFlow (wrap it in a ``tf.function`` to fine-tune many episodes without retracing), for a ``head`` on
    the TensorFlow backend; on JAX and PyTorch use :func:`fine_tune_structured_fc`. Returns the nodes.
    """
    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ValueError(f"fine_tune_nodes is written in TensorFlow and runs on Keras' TensorFlow backend, not "
                         f"{backend}; training.evaluation.structured_fc.fine_tune_structured_fc fine-tunes on every "
                         "backend.")
    _check_settings(steps, batch_size, learning_rate, momentum, seed)
    support_features = tf.convert_to_tensor(support_features, tf.float32)
    support_label = tf.convert_to_tensor(support_label, tf.int32)
    count = tf.shape(support_features)[0]
    batches = tf.random.stateless_uniform([steps, batch_size], [seed, 0], maxval=count, dtype=tf.int32)
    velocity = tf.zeros_like(nodes)
    for step in tf.range(steps):
        index = batches[step]
        with tf.GradientTape() as tape:
            tape.watch(nodes)
            logits = head([tf.gather(support_features, index), nodes])
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.gather(support_label, index),
                                                                                 tf.cast(logits, tf.float32)))
        velocity = momentum * velocity + tape.gradient(loss, nodes)
        nodes = nodes - learning_rate * velocity
    return nodes


def fine_tune_structured_fc(layer, support_features, support_label, **kwargs):
    """Initialize a :class:`ot_layers.StructuredFC` from the support means, fine-tune it, assign the nodes."""
    defaults = {name: parameter.default for name, parameter in inspect.signature(fine_tune_nodes).parameters.items()
                if parameter.default is not inspect.Parameter.empty}  # fine_tune_nodes' settings, as it takes them
    unknown = sorted(set(kwargs) - set(defaults))
    if unknown:
        raise ValueError(f"fine_tune_structured_fc takes {', '.join(defaults)}, got {unknown}.")
    settings = {**defaults, **kwargs}
    _check_settings(settings["steps"], settings["batch_size"], settings["learning_rate"], settings["momentum"],
                    settings["seed"])
    support_label = np.asarray(support_label).reshape(-1)
    layer.initialize_from_support(support_features, support_label)  # checks the labels and the features
    if keras.backend.backend() != "tensorflow":
        return _fit_nodes(layer, support_features, support_label, **settings)
    flat = tf.reshape(tf.convert_to_tensor(support_features, tf.float32),
                      [len(support_label), layer.num_nodes, -1])
    nodes = _compiled_fine_tuning(layer, settings)(flat, tf.constant(support_label, tf.int32),
                                                   tf.convert_to_tensor(layer.nodes))
    layer.nodes.assign(nodes)
    return layer


# Per structured FC layer on TensorFlow: the tf.function of fine_tune_nodes on its head, with the settings it was
# made for; a new tf.function every call traced the 100-step loop again for every episode.
_TF_FINE_TUNING = weakref.WeakKeyDictionary()


def _compiled_fine_tuning(layer, settings):
    """The cached ``tf.function`` running :func:`fine_tune_nodes` with ``settings`` on ``layer``'s head (the head,
    not the layer, in its closure, so that the cache does not keep the layer alive)."""
    key = tuple(sorted(settings.items()))
    cached = _TF_FINE_TUNING.get(layer)
    if cached is None or cached[0] != key:
        head = layer.head
        cached = _TF_FINE_TUNING[layer] = (key, tf.function(lambda f, y, n: fine_tune_nodes(head, f, y, n,
                                                                                            **settings)))
    return cached[1]


# Per structured FC layer: the compiled model that fine-tunes a twin of it (same config), with the settings it was
# compiled for. A twin keeps the user's layer out of the fine-tuning graph (no new inbound node, its ``input`` stays
# its model's), and the cache keeps JAX from compiling the training step again for every episode.
_FINE_TUNING = weakref.WeakKeyDictionary()


def _fit_nodes(layer, support_features, support_label, steps, batch_size, learning_rate, momentum, seed):
    """:func:`fine_tune_nodes`' updates through Keras' ``fit`` (any backend): ``steps`` mini-batches of
    ``batch_size`` support samples drawn uniformly with replacement (``numpy.random.default_rng(seed)``), SGD with
    ``momentum`` on the nodes (Keras' ``m <- momentum m - lr g``, ``w <- w + m`` is the velocity form
    ``v <- momentum v + g``, ``w <- w - lr v``), the velocity starting at zero; the features stay fixed. Runs on a
    twin of ``layer`` and assigns the fine-tuned nodes to ``layer``."""
    features = np.asarray(keras.ops.convert_to_numpy(support_features), np.float32)
    features = features.reshape(len(support_label), layer.num_nodes, -1)
    settings = (features.shape[1:], float(learning_rate), float(momentum))
    cached = _FINE_TUNING.get(layer)
    if cached is None or cached[0] != settings:
        twin = type(layer).from_config(layer.get_config())
        inputs = keras.Input(features.shape[1:])
        model = keras.Model(inputs, twin(inputs))
        model.compile(keras.optimizers.SGD(learning_rate, momentum=momentum),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        cached = _FINE_TUNING[layer] = (settings, model, twin)
    _, model, twin = cached
    twin.nodes.assign(layer.nodes)
    for variable in model.optimizer.variables:  # a fresh velocity (and step count) for every support set
        if variable is not model.optimizer.iterations and not variable.name.endswith("_momentum"):
            continue  # the learning rate (a variable too)
        variable.assign(np.zeros(variable.shape, keras.backend.standardize_dtype(variable.dtype)))
    chosen = np.random.default_rng(seed).integers(0, len(features), size=steps * batch_size)
    model.fit(features[chosen], support_label[chosen].astype(np.int32), batch_size=batch_size, epochs=1,
              shuffle=False, verbose=0)
    layer.nodes.assign(twin.nodes)
    return layer
