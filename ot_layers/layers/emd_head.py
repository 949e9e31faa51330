"""EMDHead: DeepEMD's Earth Mover's Distance classifier between sets of local features (Zhang et al. 2022)."""
import keras
from keras import ops

from ot_layers.layers.base import ExportableLayer
from ot_layers.tensor_ops import at_least, compute_dtype, flatten_feature_map, normalize_rows
from ot_layers.solvers.emd import (
    COSINE_KERNEL_LIMIT, METHODS, SINKHORN_EPSILON, SINKHORN_MAX_ITER, SINKHORN_THRESHOLD, emd,
    warn_of_ignored_sinkhorn_settings,
)
from ot_layers.validation import (
    check_choice, check_flag, check_input_pair, check_non_negative, check_positive, check_positive_int, check_rank,
    check_same_dim,
)

NODE_WEIGHTS = ("cross_reference", "uniform")
SCALE = 12.5  # the multiplier of the EMD similarity in the logits (a temperature; the DeepEMD paper states none,
#                12.5 is this project's default)
WEIGHT_FLOOR = 1e-3
# The head computes in float32 under the float32 and mixed_float16 policies (float64 only for float64 inputs, i.e. a
# float64 policy). At the small epsilon EMD needs, Sinkhorn amplifies float32 round-off in the costs by ~1 / epsilon:
# exported graphs (whose kernels round differently) reproduce the logits within EXPORT_PARITY_RTOL of the logits'
# scale, max |diff| / max |logit|, rather than within 1e-5 absolute (tests/test_emd_head.py measures it). Each
# problem stops at its own threshold (ot_layers.solvers.sinkhorn), so a problem whose marginal error lands within
# round-off of the threshold can take one update more or fewer in a graph than eagerly: 1.5e-5 of the logits' scale
# was measured in tests/test_emd_safety.py::test_unknown_spatial_size.
EXPORT_PARITY_RTOL = 5e-5


def _mean(x, axis):
    # sum / size rather than mean: tf2onnx maps TensorFlow's reduce_mean to a GlobalAveragePool that onnxruntime
    # has no float64 kernel for. The size is the static one when known, read at run time otherwise.
    return ops.sum(x, axis=axis, keepdims=True) / ops.cast(ops.shape(x)[axis], x.dtype)


def cross_reference_weights(query, support, floor=WEIGHT_FLOOR):
    """DeepEMD's cross-reference node weights (Zhang et al. 2022, Eq. 11-12) for every (query, class) pair.

    ``s_i = max(u_i^T mean_j v_j, 0) + floor`` for the query nodes ``u_i`` against the support set ``V`` and
    symmetrically ``d_j = max(v_j^T mean_i u_i, 0) + floor``, on the raw features; each side is normalized to sum to
    one (Eq. 12 normalizes to the node count; the logits' ``1 / n`` absorbs the difference).

    query ``(B, n, d)``, support ``(K, m, d)`` -> weights ``(B, K, n)`` and ``(B, K, m)``.
    """
    query_weights = ops.relu(ops.einsum("bnd,kd->bkn", query, _mean(support, 1)[:, 0])) + floor
    support_weights = ops.relu(ops.einsum("kmd,bd->bkm", support, _mean(query, 1)[:, 0])) + floor
    return (query_weights / ops.sum(query_weights, axis=-1, keepdims=True),
            support_weights / ops.sum(support_weights, axis=-1, keepdims=True))


def cosine_cost(query, support, center=True):
    """``c_ij = 1 - cos(u_i, v_j)`` for every (query, class) pair: ``(B, n, d)``, ``(K, m, d)`` -> ``(B, K, n, m)``.

    With ``center`` each node first has its mean over channels subtracted (as the DeepEMD authors do). Rows are
    normalized as ``tf.math.l2_normalize`` does (:func:`ot_layers.tensor_ops.normalize_rows`): a zero node has
    cosine 0 with everything (cost 1).
    """
    if center:
        query = query - _mean(query, -1)
        support = support - _mean(support, -1)
    cosine = ops.einsum("bnd,kmd->bknm", normalize_rows(query), normalize_rows(support))
    return at_least(1.0 - cosine, 0.0)


@keras.saving.register_keras_serializable(package="ot_layers")
class EMDHead(ExportableLayer):
    """Logits from the Earth Mover's Distance between query node sets and class node sets (Zhang et al. 2022).

    Call on ``[query, support]``: ``query`` ``(B, H, W, d)`` feature maps or ``(B, n, d)`` node sets; ``support``
    ``(K, H, W, d)`` or ``(K, m, d)``, one node set per class (a support feature map for 1-shot, a structured-FC node
    set or a mean feature map for k-shot). Output logits ``(B, K)``.

    For each pair: cost ``c_ij = 1 - cos(u_i, v_j)``, node weights ``a``, ``b`` (cross-reference, Eq. 11-12, or
    uniform), the optimal flow ``T`` of ``min <C, T>`` s.t. ``T 1 = a``, ``T^T 1 = b`` (Eq. 1) and the logit
    ``scale * sum_ij (1 - c_ij) T_ij`` (the similarity ``s`` of Eq. 3 with weights normalized to one, times
    ``scale``).

    Written in ``keras.ops``: runs on TensorFlow, JAX and PyTorch. Computes in float32 under the ``float32`` and
    ``mixed_float16`` policies and in float64 for float64 inputs (a ``float64`` policy); ``method="exact"`` runs the
    network simplex on the host in float64 (``tf.numpy_function`` on TensorFlow, ``jax.pure_callback`` on JAX,
    NumPy on PyTorch; see :func:`ot_layers.solvers.emd`) and returns the compute dtype. Query and support may be
    feature maps of unknown spatial size. With ``method="sinkhorn"`` NaN/Inf features give NaN logits for the
    affected query only; ``method="exact"`` raises an error naming the problem.

    Args:
      scale: the multiplier of the EMD similarity (a temperature the paper does not state; 12.5 by default; a
        multiplier, hence ``scale``).
      method: ``"exact"`` (network simplex on the host, Danskin gradients; not exportable, not XLA-compilable on
        TensorFlow, compiles under ``jax.jit`` as a host callback) or ``"sinkhorn"`` (entropic, pure ``keras.ops``,
        XLA-compilable, exportable from TensorFlow).
      node_weights: ``"cross_reference"`` or ``"uniform"``.
      center: subtract each node's channel mean before the cosine.
      weight_floor: the small constant added to the cross-reference weights.
      epsilon, max_iter, threshold: Sinkhorn settings for ``method="sinkhorn"``; the kernel domain is used while
        ``2 / epsilon <= COSINE_KERNEL_LIMIT`` (cosine costs lie in [0, 2]), the log domain otherwise.
        ``method="exact"`` ignores them, and warns (``UserWarning``) when one is given a value other than its
        default.
    """

    ITERATIVE = True  # its solver loop keeps it eager on PyTorch (ExportableLayer)

    INPUT_NAMES = ("query", "support")

    def __init__(self, scale=SCALE, method="exact", node_weights="cross_reference", center=True,
                 weight_floor=WEIGHT_FLOOR, epsilon=SINKHORN_EPSILON, max_iter=SINKHORN_MAX_ITER,
                 threshold=SINKHORN_THRESHOLD, **kwargs):
        super().__init__(**kwargs)
        self.scale = float(check_positive("scale", scale))
        self.method = check_choice("method", method, METHODS)
        self.node_weights = check_choice("node_weights", node_weights, NODE_WEIGHTS)
        self.center = check_flag("center", center)
        self.weight_floor = float(check_positive("weight_floor", weight_floor))
        self.epsilon = float(check_positive("epsilon", epsilon))
        self.max_iter = check_positive_int("max_iter", max_iter)
        self.threshold = float(check_non_negative("threshold", threshold))
        if self.method == "exact":
            warn_of_ignored_sinkhorn_settings("EMDHead", epsilon=self.epsilon, max_iter=self.max_iter,
                                              threshold=self.threshold)
        # Keras' jit_compile="auto" leaves XLA off for a model holding a layer that cannot be compiled: the exact
        # method's tf.numpy_function cannot (JAX's host callback can; PyTorch: see ExportableLayer).
        self.supports_jit = self.method != "exact" or keras.backend.backend() == "jax"

    def _export_blocker_reason(self):
        """``None`` for ``method="sinkhorn"``; for ``"exact"`` the reason and the exportable alternative."""
        if self.method == "exact":
            return ('EMDHead(method="exact") runs POT\'s network simplex in a Python function, which SavedModel and '
                    'ONNX cannot hold; use EMDHead(method="sinkhorn") (pure keras.ops) for an exportable model.')
        return None

    @property
    def sinkhorn_domain(self):
        """The Sinkhorn domain of ``method="sinkhorn"``: ``"kernel"`` while the cosine kernel ``exp(-c / epsilon)``
        stays representable (``2 / epsilon <= COSINE_KERNEL_LIMIT``), ``"log"`` otherwise."""
        return "kernel" if 2.0 / self.epsilon <= COSINE_KERNEL_LIMIT else "log"

    def _solve(self, query, support):
        """``(cost, a, b, result)`` as :meth:`transport`, with ``a = b = None`` for uniform node weights (the solver
        builds them), so the forward pass builds nothing it does not use."""
        dtype = compute_dtype(query.dtype)
        query = ops.cast(query, dtype)
        support = ops.cast(support, dtype)
        cost = cosine_cost(query, support, self.center)
        if self.node_weights == "cross_reference":
            a, b = cross_reference_weights(query, support, self.weight_floor)
        else:
            a = b = None  # the solver's uniform 1/n, 1/m
        sinkhorn_settings = (dict(epsilon=self.epsilon, max_iter=self.max_iter, threshold=self.threshold,
                                  domain=self.sinkhorn_domain) if self.method == "sinkhorn" else {})
        result = emd(cost, a, b, method=self.method, **sinkhorn_settings)
        return cost, a, b, result

    def transport(self, query, support):
        """The optimal flows between node sets ``query`` ``(B, n, d)`` and ``support`` ``(K, m, d)`` under this
        head's settings (Zhang et al. 2022, Eq. 1-2 and 11-12): ``(cost (B, K, n, m), a (B, K, n), b (B, K, m),
        result)`` with the cosine cost of Eq. 2, the node weights (cross-reference, Eq. 11-12, or uniform ``1/n``,
        ``1/m``) and the ``solvers.emd`` :class:`EMDResult` (``plan``, ``cost``, ``f``, ``g`` and the per-problem
        ``iterations``, ``error``, ``converged``). Computes in float32 (float64 for float64 ``query``)."""
        cost, a, b, result = self._solve(query, support)
        if a is None:
            shape = ops.shape(cost)
            a = ops.ones_like(cost[..., 0]) / ops.cast(shape[-2], cost.dtype)
            b = ops.ones_like(cost[..., 0, :]) / ops.cast(shape[-1], cost.dtype)
        return cost, a, b, result

    def similarity(self, query, support):
        """EMD similarities ``sum_ij (1 - c_ij) T_ij`` ``(B, K)`` of node sets ``(B, n, d)`` and ``(K, m, d)``, in
        float32 (float64 for float64 ``query``)."""
        # Both weight vectors sum to one, so sum (1 - c) T = 1 - <C, T>.
        return 1.0 - self._solve(query, support)[3].cost

    @staticmethod
    def check_shapes(query_shape, support_shape):
        check_rank("query", query_shape, (3, 4))
        check_rank("support", support_shape, (3, 4))
        check_same_dim("query", query_shape[-1], "support", support_shape[-1])

    def build(self, input_shape):
        # the first call's inputs, checked before Keras' report of a failed call (see check_input_pair)
        self.check_shapes(*check_input_pair(self, input_shape))

    def call(self, inputs):
        query, support = check_input_pair(self, inputs)
        self.check_shapes(query.shape, support.shape)
        logits = self.scale * self.similarity(flatten_feature_map(query), flatten_feature_map(support))
        return ops.cast(logits, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], input_shape[1][0])

    def get_config(self):
        config = super().get_config()
        config.update(scale=self.scale, method=self.method, node_weights=self.node_weights,
                      center=self.center, weight_floor=self.weight_floor, epsilon=self.epsilon,
                      max_iter=self.max_iter, threshold=self.threshold)
        return config
