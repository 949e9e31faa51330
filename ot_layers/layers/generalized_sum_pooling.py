"""GeneralizedSumPooling: learned partial-transport selection of feature-map elements (Gurbuz 2022 thesis,
ch. 5, Eq. 5.2.1-5.2.3), written in ``keras.ops``: it runs on any Keras backend (TensorFlow, JAX, PyTorch)."""
import keras
from keras import ops

from ot_layers.layers.base import ExportableLayer
from ot_layers.layers.weight_initializer import resolve_initializer
from ot_layers.solvers.partial_transport import GRADIENTS, METHODS, partial_transport
from ot_layers.tensor_ops import at_least, flatten_feature_map
from ot_layers.validation import (
    check_choice,
    check_flag,
    check_in_range,
    check_non_negative,
    check_positive,
    check_positive_int,
    check_rank,
)


def _clip_norm(x):
    """``u / max(1, ||u||_2)`` along the last axis (the thesis' normalization of features and prototypes, ch. 3 and
    5). Written with the squared norm so that an all-zero vector has a finite (zero) gradient."""
    squared = ops.sum(x * x, axis=-1, keepdims=True)
    return x * ops.rsqrt(at_least(squared, 1.0))


def _euclidean_cost(prototypes, features):
    """``c_kj = ||w_k - f_j||_2`` (not squared), ``(B, m, n)`` from prototypes ``(m, d)`` and features ``(B, n, d)``."""
    squared = (ops.sum(prototypes * prototypes, axis=-1)[None, :, None]
               + ops.sum(features * features, axis=-1)[:, None, :]
               - 2.0 * ops.einsum("md,bnd->bmn", prototypes, features))
    return ops.sqrt(at_least(squared, 1e-12))


@keras.saving.register_keras_serializable(package="ot_layers")
class GeneralizedSumPooling(ExportableLayer):
    """Generalized sum pooling: a feature map ``(B, H, W, C)`` (or ``(B, n, C)``) -> pooled vector ``(B, C)``.

    With learnable prototypes ``w_k`` (``k <= m``) and cost ``c_kj = ||w̄_k - f̄_j||`` (``ū = u / max(1, ||u||)``),
    the entropic partial transport (P2) of mass ``mu`` (``transport_ratio``) from the elements to the prototypes
    (Prop. 5.2.1, ``ot_layers.solvers.partial_transport``) gives the pooling weights ``p_j = (1/n - rho_j) / mu``,
    computed as the transported mass ``sum_k pi_kj / mu`` (equal at the fixed point, exactly summing to 1 and free
    of the cancellation ``1/n - rho_j``), and the output ``g = sum_j p_j f_j`` (Eq. 5.2.1); ``mu = 1`` is exactly
    global average pooling. With ``return_attributes=True`` the layer also returns the pseudo-attributes
    ``z = (1/mu) sum_j pi_.j`` ``(B, m)`` (Eq. 5.2.3) for the zero-shot loss.

    Args:
      num_prototypes: ``m``, the number of prototypes (64 small data, 128 large data in the thesis).
      transport_ratio: ``mu`` in (0, 1] (0.3).
      epsilon: entropic regularization, ``1 / gamma`` (the kernel is ``exp(-c / epsilon)``): 0.2 (the
        thesis' ``gamma = 5``, used with pair losses) by default; use 2.0 (``gamma = 0.5``) with proxy losses.
      max_iter, threshold: bound on the solver's evaluations and the stopping tolerance on the marginal error
        (``threshold=0`` runs exactly ``max_iter``). Each sample's transport stops at its own tolerance, so a
        sample's output does not depend on the rest of its batch.
      method: how the solver finds Prop. 5.2.1's fixed point (``partial_transport``'s ``method``):
        ``"newton"`` (safeguarded Newton steps on the scaling, a handful of evaluations) or ``"fixed_point"``
        (the thesis' update as published, which needs hundreds or more for sharp selections, small ``epsilon``,
        and may stop at ``max_iter`` short of the tolerance). Both reach the same fixed point, and the implicit
        gradient is the same.
      gradient: ``"implicit"`` (Prop. 5.2.2, guarded for sharp selections) or ``"unrolled"``.
      return_attributes: also return ``z``.
      initializer: initializer of the prototypes ``(m, C)``.

    State (non-trainable weights, saved with the model): ``average_pooling_warmup`` (1 while the layer pools like
    GAP), ``warmup_epochs_done`` and ``prototypes_initialized``, written by ``ot_layers.callbacks.GSPPrototypeInit``
    (GAP warm-up, then greedy k-center prototypes), so that a resumed run continues the warm-up where it stopped.
    The transport computes in float32 under mixed precision (the variable dtype); the feature dimension must be
    known, the spatial size may be unknown. NaN in one sample stays in that sample's outputs. Written in
    ``keras.ops``, the layer runs on any Keras backend (TensorFlow, JAX, PyTorch).
    """

    ITERATIVE = True  # its solver loop keeps it eager on PyTorch (ExportableLayer)

    def __init__(self, num_prototypes=64, transport_ratio=0.3, *, epsilon=0.2, max_iter=100, threshold=1e-6,
                 method="newton", gradient="implicit", return_attributes=False, initializer="random_normal",
                 **kwargs):
        super().__init__(**kwargs)
        self.num_prototypes = check_positive_int("num_prototypes", num_prototypes)
        self.transport_ratio = float(check_in_range("transport_ratio", transport_ratio, 0.0, 1.0, low_open=True))
        self.epsilon = float(check_positive("epsilon", epsilon))
        self.max_iter = check_positive_int("max_iter", max_iter)
        self.threshold = float(check_non_negative("threshold", threshold))
        self.method = check_choice("method", method, METHODS)
        self.gradient = check_choice("gradient", gradient, GRADIENTS)
        self.return_attributes = check_flag("return_attributes", return_attributes)
        self.initializer = resolve_initializer("initializer", initializer)

    def build(self, input_shape):
        check_rank("inputs", input_shape, (3, 4))
        if input_shape[-1] is None:
            raise ValueError("`inputs`: GeneralizedSumPooling needs a known feature dimension (the last axis).")
        self.prototypes = self.add_weight(name="prototypes", shape=(self.num_prototypes, int(input_shape[-1])),
                                          initializer=self.initializer, trainable=True,
                                          autocast=False)  # read in float32 under mixed precision
        self.input_spec = keras.layers.InputSpec(axes={-1: int(input_shape[-1])})  # another dim later: one error line
        self.average_pooling_warmup = self.add_weight(name="average_pooling_warmup", shape=(),
                                                      initializer="zeros", trainable=False)
        self.warmup_epochs_done = self.add_weight(name="warmup_epochs_done", shape=(), initializer="zeros",
                                                  trainable=False)
        self.prototypes_initialized = self.add_weight(name="prototypes_initialized", shape=(), initializer="zeros",
                                                      trainable=False)

    def flat_features(self, inputs):
        """``inputs`` ``(B, H, W, C)`` or ``(B, n, C)`` as the transport takes them: ``(B, n, C)`` in float64 under
        a float64 policy, else float32 (also under mixed precision)."""
        dtype = "float64" if self.variable_dtype == "float64" else "float32"
        return flatten_feature_map(ops.cast(inputs, dtype))

    def transport(self, features):
        """The partial transport of Prop. 5.2.1 between the prototypes and features ``(B, n, C)`` (float32/64):
        the solver's ``PartialTransportResult`` (``plan`` ``(B, m, n)``, rows: prototypes; per-sample
        ``iterations``, ``error`` and ``converged``), before the warm-up mixing of :meth:`pooling_weights`."""
        prototypes = ops.cast(self.prototypes, features.dtype)
        cost = _euclidean_cost(_clip_norm(prototypes), _clip_norm(features))
        return partial_transport(cost, self.transport_ratio, epsilon=self.epsilon, max_iter=self.max_iter,
                                 threshold=self.threshold, method=self.method, gradient=self.gradient)

    def pooling_weights(self, features):
        """Pooling weights ``(B, n)`` and transport plan ``(B, m, n)`` for features ``(B, n, C)`` (float32/64).

        The weights are the transported mass over ``transport_ratio`` (``p_j``, Eq. 5.2.1; they sum to one),
        mixed with the uniform ``1/n`` by the warm-up flag; the plan is ``pi`` of Prop. 5.2.1 (rows: prototypes)."""
        result = self.transport(features)
        transported = ops.sum(result.plan, axis=1)  # q_j = 1/n - rho_j at the fixed point
        weights = transported / self.transport_ratio
        n = ops.cast(ops.shape(features)[1], features.dtype)
        warmup = ops.cast(self.average_pooling_warmup, features.dtype)
        return (1.0 - warmup) * weights + warmup / n, result.plan

    def pool(self, features):
        """Pooled vectors ``(B, C)`` and pseudo-attributes ``(B, m)`` (Eq. 5.2.3) of features ``(B, n, C)``."""
        weights, plan = self.pooling_weights(features)
        pooled = ops.einsum("bn,bnc->bc", weights, features)
        attributes = ops.sum(plan, axis=-1) / self.transport_ratio
        return pooled, attributes

    def call(self, inputs):
        pooled, attributes = self.pool(self.flat_features(inputs))
        pooled = ops.cast(pooled, self.compute_dtype)
        if self.return_attributes:
            return pooled, ops.cast(attributes, self.compute_dtype)
        return pooled

    def compute_output_shape(self, input_shape):
        pooled = (input_shape[0], input_shape[-1])
        return (pooled, (input_shape[0], self.num_prototypes)) if self.return_attributes else pooled

    def get_config(self):
        config = super().get_config()
        config.update(num_prototypes=self.num_prototypes, transport_ratio=self.transport_ratio, epsilon=self.epsilon,
                      max_iter=self.max_iter, threshold=self.threshold, method=self.method,
                      gradient=self.gradient, return_attributes=self.return_attributes,
                      initializer=keras.initializers.serialize(self.initializer))
        return config
