"""SinkhornMatch: entropic OT plans between a feature map's elements and sets of target vectors (Cuturi 2013;
Liu et al. 2021)."""
import keras
import numpy as np
from keras import ops

from ot_layers.backends import custom_gradient
from ot_layers.layers.base import ExportableLayer
from ot_layers.solvers.sinkhorn import DOMAINS, GRADIENTS, KERNEL_DOMAIN_LIMIT, sinkhorn
from ot_layers.tensor_ops import at_least, compute_dtype, flatten_feature_map, normalize_rows
from ot_layers.validation import (
    check_choice, check_flag, check_input_pair, check_non_negative, check_positive, check_positive_int, check_rank,
    check_same_dim,
)

COSTS = ("cosine", "sqeuclidean")
PAIRINGS = ("class", "sample")


def safe_power(base, p):
    """``base ** p`` for ``base >= 0`` with a finite gradient everywhere (the cost exponent of Liu et al. 2021, Eq. 8).

    ``d base^p / d base = p base^(p-1)`` is infinite at ``base = 0`` for ``p < 1``. There the function is at its
    minimum (``base`` is a cost, ``>= 0``), so 0 is a subgradient and is what this returns; for ``0 < base`` the
    slope is exact down to the dtype's machine epsilon, below which it is held at its value there (a bounded slope
    for round-off-sized costs). NaN stays NaN.
    """
    p = float(p)
    if p == 1.0:
        return base

    @custom_gradient
    def power(x):
        y = ops.power(x, p)

        def grad(dy):
            at = at_least(x, float(np.finfo(keras.backend.standardize_dtype(x.dtype)).eps)) if p < 1 else x
            slope = p * ops.power(at, p - 1.0)
            return (dy * ops.where(ops.equal(x, 0), ops.zeros_like(x), slope),)

        return y, grad

    return power(base)


def pairwise_cost(features, targets, cost="cosine", p=1.0, pairing="class"):
    """Costs and raw inner products between set elements.

    features ``(B, n, d)``; targets ``(K, M, d)`` for ``pairing="class"`` (every sample against every class set,
    result ``(B, K, n, M)``) or ``(B, M, d)`` for ``pairing="sample"`` (result ``(B, n, M)``).
    Cosine cost ``(1 - cos)^p`` (Liu et al. 2021, Eq. 7-8) or squared Euclidean ``||x - y||^(2p)``; the power has a
    finite gradient at a zero cost (:func:`safe_power`). A zero vector has cosine 0 with everything (cost ``1``).
    """
    equation = "bnd,kmd->bknm" if pairing == "class" else "bnd,bmd->bnm"
    inner = ops.einsum(equation, features, targets)
    if cost == "cosine":
        base = 1.0 - ops.einsum(equation, normalize_rows(features), normalize_rows(targets))
    else:
        sq_f = ops.sum(ops.square(features), axis=-1)
        sq_t = ops.sum(ops.square(targets), axis=-1)
        if pairing == "class":
            base = sq_f[:, None, :, None] + sq_t[None, :, None, :] - 2.0 * inner
        else:
            base = sq_f[:, :, None] + sq_t[:, None, :] - 2.0 * inner
    base = at_least(base, 0.0)
    return safe_power(base, p), inner


@keras.saving.register_keras_serializable(package="ot_layers")
class SinkhornMatch(ExportableLayer):
    """Entropic OT plans between a set / feature map and target sets (Sinkhorn; Cuturi 2013).

    Call on ``[features, targets]``: ``features`` ``(B, n, d)`` or a feature map ``(B, H, W, d)``; ``targets``
    ``(K, M, d)`` per-class sets (``pairing="class"``, plans ``(B, K, n, M)``) or ``(B, M, d)`` per-sample sets
    (``pairing="sample"``, plans ``(B, n, M)``). Marginals are uniform (``1/n`` and ``1/M``). With
    ``return_cost=True`` the layer returns ``(plans, costs)``, ``costs = <C, T>`` per pair.

    Args:
      cost: ``"cosine"`` (``(1 - cos)^p``) or ``"sqeuclidean"`` (``||x - y||^(2p)``).
      p: exponent of the cost (``> 0``; the paper finds ``p = 1`` best); ``p < 1`` has a finite gradient at a zero
        cost (:func:`safe_power`).
      epsilon, max_iter, threshold, domain, gradient: as in :func:`ot_layers.solvers.sinkhorn`, except for the
        default ``threshold=0.1`` (the MPW head's, Liu et al. 2021; the solver's is 1e-3): a row-marginal error of
        up to 10 % (L1), which the head's logits tolerate (docs/results/sinkhorn_mpw.md); pass ``threshold=1e-3`` or
        lower for plans that meet their marginals closely. ``domain="auto"`` is resolved once, statically, so the
        graph has no data-dependent branch (which tf2onnx cannot convert to ONNX): with the cosine cost from the
        cost's bound ``2^p`` (the kernel domain while ``2^p / epsilon`` is below the solver's kernel limit, else the
        log domain); with the squared Euclidean cost, which has no bound, the log domain (always safe; the kernel
        domain would give the same plans to round-off where it is safe). Pass ``domain="kernel"`` for the kernel
        domain's speed on costs known to be small.
    """

    ITERATIVE = True  # its solver loop keeps it eager on PyTorch (ExportableLayer)

    INPUT_NAMES = ("features", "targets")

    def __init__(self, cost="cosine", p=1.0, epsilon=0.1, max_iter=100, threshold=0.1, domain="auto",
                 gradient="implicit", pairing="class", return_cost=False, **kwargs):
        super().__init__(**kwargs)
        self.cost = check_choice("cost", cost, COSTS)
        self.p = float(check_positive("p", p))
        self.epsilon = float(check_positive("epsilon", epsilon))
        self.max_iter = check_positive_int("max_iter", max_iter)
        self.threshold = float(check_non_negative("threshold", threshold))
        self.domain = check_choice("domain", domain, DOMAINS)
        self.gradient = check_choice("gradient", gradient, GRADIENTS)
        self.pairing = check_choice("pairing", pairing, PAIRINGS)
        self.return_cost = check_flag("return_cost", return_cost)

    def _solver_domain(self):
        """The solver's domain: ``domain``, with ``"auto"`` resolved statically (see the class docstring)."""
        if self.domain != "auto":
            return self.domain
        if self.cost == "cosine":
            return "kernel" if 2.0 ** self.p / self.epsilon < KERNEL_DOMAIN_LIMIT["float32"] else "log"
        # sqeuclidean: unbounded, so only a per-batch branch could pick the kernel domain safely, and that branch
        # (a tf.cond around two loops) does not convert to ONNX.
        return "log"

    def check_shapes(self, features_shape, targets_shape):
        check_rank("features", features_shape, (3, 4))
        check_rank("targets", targets_shape, (3,))
        check_same_dim("features", features_shape[-1], "targets", targets_shape[-1])
        batch, targets_batch = features_shape[0], targets_shape[0]
        if self.pairing == "sample" and None not in (batch, targets_batch) and batch != targets_batch:
            raise ValueError(f"`pairing='sample'` matches each sample with its own targets: `features` holds {batch} "
                             f"samples but `targets` {targets_batch}.")

    def match(self, features, targets):
        """``(plans, inner products, SinkhornResult)`` for flattened ``features`` ``(B, n, d)`` and ``targets``, in
        float32 (float64 for float64 ``features``)."""
        dtype = compute_dtype(features.dtype)  # float32, also under mixed precision; float64 for float64
        features = ops.cast(features, dtype)
        targets = ops.cast(targets, dtype)
        cost, inner = pairwise_cost(features, targets, self.cost, self.p, self.pairing)
        result = sinkhorn(cost, epsilon=self.epsilon, max_iter=self.max_iter, threshold=self.threshold,
                          domain=self._solver_domain(), gradient=self.gradient)
        return result.plan, inner, result

    def build(self, input_shape):
        # the first call's inputs, checked before Keras' report of a failed call (see check_input_pair)
        self.check_shapes(*check_input_pair(self, input_shape))

    def call(self, inputs):
        features, targets = check_input_pair(self, inputs)
        self.check_shapes(features.shape, targets.shape)
        plan, _, result = self.match(flatten_feature_map(features), targets)
        plan = ops.cast(plan, self.compute_dtype)
        if self.return_cost:
            return plan, ops.cast(result.transport_cost, self.compute_dtype)
        return plan

    def compute_output_shape(self, input_shape):
        features_shape, targets_shape = input_shape
        batch = features_shape[0]
        n = None
        if len(features_shape) == 4 and None not in features_shape[1:3]:
            n = features_shape[1] * features_shape[2]
        elif len(features_shape) == 3:
            n = features_shape[1]
        if self.pairing == "class":
            plan, cost = (batch, targets_shape[0], n, targets_shape[1]), (batch, targets_shape[0])
        else:
            plan, cost = (batch, n, targets_shape[1]), (batch,)
        return (plan, cost) if self.return_cost else plan

    def get_config(self):
        config = super().get_config()
        config.update(cost=self.cost, p=self.p, epsilon=self.epsilon, max_iter=self.max_iter,
                      threshold=self.threshold, domain=self.domain, gradient=self.gradient,
                      pairing=self.pairing, return_cost=self.return_cost)
        return config
