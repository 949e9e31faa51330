"""GeneralizedSumPooling: learned partial-transport selection of feature-map elements (paper 003, ch. 5, SPEC S3)."""
import keras
import tensorflow as tf

from ot_layers.solvers.partial_transport import GRADIENTS, partial_transport
from ot_layers.validation import check_choice, check_in_range, check_positive, check_positive_int, check_rank


def _clip_norm(x):
    """``u / max(1, ||u||_2)`` along the last axis (the thesis' normalization of features and prototypes)."""
    return x / tf.maximum(1.0, tf.norm(x, axis=-1, keepdims=True))


def _euclidean_cost(prototypes, features):
    """``c_kj = ||w_k - f_j||_2`` (not squared), ``(B, m, n)`` from prototypes ``(m, d)`` and features ``(B, n, d)``."""
    squared = (tf.reduce_sum(prototypes * prototypes, axis=-1)[None, :, None]
               + tf.reduce_sum(features * features, axis=-1)[:, None, :]
               - 2.0 * tf.einsum("md,bnd->bmn", prototypes, features))
    return tf.sqrt(tf.maximum(squared, 1e-12))


@keras.saving.register_keras_serializable(package="ot_layers")
class GeneralizedSumPooling(keras.layers.Layer):
    """Generalized sum pooling: a feature map ``(B, H, W, C)`` (or ``(B, n, C)``) -> pooled vector ``(B, C)``.

    With learnable prototypes ``w_k`` (``k <= m``) and cost ``c_kj = ||w̄_k - f̄_j||``, the residual ``rho`` of the
    entropic partial transport (P2) of mass ``mu`` (``transport_ratio``) from the elements to the prototypes
    (Prop. 5.2.1, ``ot_layers.solvers.partial_transport``) gives the pooling weights
    ``p_j = (1/n - rho_j) / mu`` and the output ``g = sum_j p_j f_j`` (Eq. 5.2.1); ``mu = 1`` is exactly global
    average pooling. Gradients use the closed form of Prop. 5.2.2 by default (``gradient="closed_form"``).
    With ``return_attributes=True`` the layer also returns the pseudo-attributes ``z = (1/mu) sum_j pi_.j``
    ``(B, m)`` (Eq. 5.2.3) for the zero-shot loss. ``inverse_temperature`` ``gamma`` is the thesis' ``epsilon``
    (0.5 with proxy losses, 5.0 with pair losses).

    The non-trainable weight ``average_pooling_warmup`` (0 by default) switches the output to plain average
    pooling while it is 1; ``ot_layers.callbacks.GSPPrototypeInit`` uses it for the GAP warm-up before it
    initializes the prototypes by greedy k-center. Computation runs in the variable dtype (float32 under mixed
    precision).
    """

    def __init__(self, num_prototypes=64, transport_ratio=0.3, inverse_temperature=5.0, max_iter=100,
                 gradient="closed_form", return_attributes=False, prototype_initializer="random_normal", **kwargs):
        super().__init__(**kwargs)
        self.num_prototypes = check_positive_int("num_prototypes", num_prototypes)
        self.transport_ratio = float(check_in_range("transport_ratio", transport_ratio, 0.0, 1.0, low_open=True))
        self.inverse_temperature = float(check_positive("inverse_temperature", inverse_temperature))
        self.max_iter = check_positive_int("max_iter", max_iter)
        self.gradient = check_choice("gradient", gradient, GRADIENTS)
        self.return_attributes = bool(return_attributes)
        self.prototype_initializer = keras.initializers.get(prototype_initializer)

    def build(self, input_shape):
        check_rank("inputs", input_shape, (3, 4))
        if input_shape[-1] is None:
            raise ValueError("GeneralizedSumPooling needs a known feature dimension (the last axis of `inputs`).")
        self.prototypes = self.add_weight(name="prototypes", shape=(self.num_prototypes, int(input_shape[-1])),
                                          initializer=self.prototype_initializer, trainable=True)
        self.average_pooling_warmup = self.add_weight(name="average_pooling_warmup", shape=(),
                                                      initializer="zeros", trainable=False)

    def pool(self, features):
        """Pooled vectors ``(B, C)`` and pseudo-attributes ``(B, m)`` of features ``(B, n, C)`` (their dtype)."""
        prototypes = tf.cast(self.prototypes, features.dtype)
        cost = _euclidean_cost(_clip_norm(prototypes), _clip_norm(features))
        result = partial_transport(cost, self.transport_ratio, self.inverse_temperature, self.max_iter,
                                   self.gradient)
        n = tf.cast(tf.shape(features)[1], features.dtype)
        weights = (1.0 / n - result.residual) / self.transport_ratio
        warmup = tf.cast(self.average_pooling_warmup, features.dtype)
        weights = (1.0 - warmup) * weights + warmup / n
        pooled = tf.einsum("bn,bnc->bc", weights, features)
        attributes = tf.reduce_sum(result.plan, axis=-1) / self.transport_ratio
        return pooled, attributes

    def call(self, inputs):
        features = tf.cast(inputs, self.variable_dtype)  # float32 under mixed precision
        if features.shape.rank == 4:
            features = tf.reshape(features, [tf.shape(features)[0], -1, features.shape[-1]])
        pooled, attributes = self.pool(features)
        pooled = tf.cast(pooled, self.compute_dtype)
        if self.return_attributes:
            return pooled, tf.cast(attributes, self.compute_dtype)
        return pooled

    def compute_output_shape(self, input_shape):
        pooled = (input_shape[0], input_shape[-1])
        return (pooled, (input_shape[0], self.num_prototypes)) if self.return_attributes else pooled

    def get_config(self):
        config = super().get_config()
        config.update(num_prototypes=self.num_prototypes, transport_ratio=self.transport_ratio,
                      inverse_temperature=self.inverse_temperature, max_iter=self.max_iter, gradient=self.gradient,
                      return_attributes=self.return_attributes,
                      prototype_initializer=keras.initializers.serialize(self.prototype_initializer))
        return config
