"""HypersphericalPrototypes: cosine classifier on fixed prototypes with a re-assignable label map (DL2PA, paper
001, SPEC S6)."""
import keras
import numpy as np
import tensorflow as tf

from ot_layers.solvers.prototypes import estimate_prototypes
from ot_layers.validation import check_in_range, check_positive_int, check_rank, check_same_dim


@keras.saving.register_keras_serializable(package="ot_layers")
class HypersphericalPrototypes(keras.layers.Layer):
    """Logits ``s_k = cos(z, p_{sigma(k)})`` for a feature ``z`` ``(B, dim)`` (paper 001, Sec. 3.3, inference rule).

    State (all Keras variables, so ``.keras`` files, checkpoints and exported graphs carry it):

    - ``prototypes`` ``(K, dim)``: fixed unit vectors from ``solvers.estimate_prototypes`` (non-trainable);
    - ``assignment`` ``(K,)`` int32: the bijection ``sigma`` class -> prototype row (identity at first), changed by
      ``callbacks.PrototypeReassignment`` between epochs;
    - ``representatives`` ``(K, dim)``: class representatives ``c_k``, the L2-normalized exponential moving average
      of the normalized features of class ``k`` (paper 001, Sec. 3.2): in a training call with ``labels``,
      ``c_k <- normalize(momentum * c_k + (1 - momentum) * mean_{i: y_i = k} z_i/||z_i||)`` for every class in the
      batch. Under a distribution strategy the replicas' updates are averaged.

    Train with ``losses.HypersphericalPullLoss`` (``(1 - s_y)^2``, pull towards the assigned prototype only) on the
    logits, passing the integer labels to the layer in training: ``layer(features, labels=labels)``; at inference
    call it without labels.
    """

    def __init__(self, num_classes, dim, momentum=0.9, prototype_steps=1000, prototype_seed=0, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = check_positive_int("num_classes", num_classes)
        if self.num_classes < 2:
            raise ValueError(f"`num_classes` must be >= 2, got {num_classes!r}.")
        self.dim = check_positive_int("dim", dim)
        self.momentum = float(check_in_range("momentum", momentum, 0.0, 1.0, high_open=True))
        self.prototype_steps = check_positive_int("prototype_steps", prototype_steps)
        self.prototype_seed = int(prototype_seed)

    def build(self, input_shape):
        check_rank("inputs", input_shape, (2,))
        check_same_dim("inputs", input_shape[-1], "dim", self.dim)
        initial = estimate_prototypes(self.num_classes, self.dim, steps=self.prototype_steps,
                                      seed=self.prototype_seed)
        self.prototypes = self.add_weight(name="prototypes", shape=(self.num_classes, self.dim),
                                          initializer=keras.initializers.Constant(initial), trainable=False,
                                          autocast=False)
        self.assignment = self.add_weight(
            name="assignment", shape=(self.num_classes,), dtype="int32", trainable=False,
            initializer=keras.initializers.Constant(np.arange(self.num_classes, dtype=np.int32)))
        self.representatives = self.add_weight(name="representatives", shape=(self.num_classes, self.dim),
                                               initializer="zeros", trainable=False, aggregation="mean",
                                               autocast=False)

    def assigned_prototypes(self):
        """``(K, dim)`` float32: row ``k`` is the prototype ``p_{sigma(k)}`` of class ``k``."""
        return tf.gather(tf.convert_to_tensor(self.prototypes),
                         tf.convert_to_tensor(self.assignment))

    def call(self, inputs, labels=None, training=None):
        z = tf.math.l2_normalize(tf.cast(inputs, tf.float32), axis=-1, epsilon=1e-12)
        if training and labels is not None:
            self._update_representatives(z, labels)
        logits = tf.matmul(z, self.assigned_prototypes(), transpose_b=True)
        return tf.cast(logits, self.compute_dtype)

    def _update_representatives(self, z, labels):
        labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
        z = tf.stop_gradient(z)
        sums = tf.math.unsorted_segment_sum(z, labels, self.num_classes)
        counts = tf.math.unsorted_segment_sum(tf.ones_like(labels, tf.float32), labels, self.num_classes)
        present = counts[:, None] > 0
        batch_means = sums / tf.maximum(counts[:, None], 1.0)
        old = tf.convert_to_tensor(self.representatives)
        moved = tf.math.l2_normalize(self.momentum * old + (1.0 - self.momentum) * batch_means, axis=-1,
                                     epsilon=1e-12)
        self.representatives.assign(tf.where(present, moved, old))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_classes)

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, dim=self.dim, momentum=self.momentum,
                      prototype_steps=self.prototype_steps, prototype_seed=self.prototype_seed)
        return config
