"""Entropic partial transport with a residual, GSP's selection problem (Gurbuz 2022 thesis, ch. 5, problem (P2),
Prop. 5.2.1-5.2.2).

For a cost ``c`` ``(m, n)`` between ``m`` prototypes and ``n`` feature-map elements, transport ratio ``mu`` and
entropic regularization ``epsilon`` (``1 / gamma`` for the inverse temperature ``gamma`` of the kernel
``exp(-gamma c) = exp(-c / epsilon)``), problem (P2):

    min_{pi, rho >= 0}  <c, pi> + epsilon (sum pi log pi + sum rho log rho)
    s.t.  rho_j + sum_k pi_kj = 1/n,   sum_kj pi_kj = mu.

Its solution is the fixed point of Prop. 5.2.1: with ``K = exp(-c / epsilon)`` and column sums ``s_j = sum_k K_kj``,
iterate ``rho <- (1/n) / (1 + t s)`` and ``t <- mu / (s^T rho)``; the plan is ``pi = t K diag(rho)``. Only the
scalar ``t`` is unknown: the fixed point is the root of ``g(log t) = mu``, where ``g(log t) = t s^T rho = (1/n)
sum_j sigmoid(log t + log s_j)`` is the mass the scaling transports, increasing from 0 to 1. Prop. 5.2.1's update is
``log t <- log t + log mu - log g(log t)``, a contraction whose rate ``1 - d log g / d log t`` tends to 1 as the
selection sharpens (every ``sigmoid`` near 0 or 1): hundreds to thousands of updates at ``epsilon = 0.01``, and no
convergence in thousands at ``1e-3``. ``method="newton"`` (the default) divides that update by the slope
``d log g / d log t = sum_j sigmoid_j (1 - sigmoid_j) / sum_j sigmoid_j``, Newton's step in ``log t``, safeguarded
by a bracket of the root (bounds from ``sigmoid(x) <= exp(x)``, ``1 - sigmoid(x) <= exp(-x)`` and the extreme
column sums) that every evaluation narrows; a step leaving the bracket is replaced by its midpoint (as in Press et
al. 2007, sec. 9.4). It converges in a handful of evaluations at every epsilon (a dozen at ``1e-3``), and the fixed
point, hence the solution and its gradient, are Prop. 5.2.1's. ``method="fixed_point"`` runs the update as
published. Everything runs in the log domain (``log s_j`` by a log-sum-exp over the prototypes, ``log rho_j = -log
n - softplus(log t + log s_j)``), so no ``exp`` over- or underflows even for ``epsilon = 1e-3`` in float32.

Each evaluation at a scaling ``x`` also gives the update ``w`` of it; the solution returned is built from the last
pair (``rho`` from ``x``, the plan from ``w``), so the plan's mass is ``mu`` up to round-off. Each problem of a batch
stops after ``max_iter`` evaluations or once the column-marginal error of its returned solution, ``sum_j |rho_j +
sum_k pi_kj - 1/n|`` (which equals ``mu |1 - x / w|`` in ``t``, that is ``|g - mu|``; the total mass is 1), is at
most ``threshold``: a converged problem is frozen while the others iterate (the loop Sinkhorn uses,
``sinkhorn.per_problem_loop``), so a batch's results equal each problem's solved alone and a GSP embedding does not
depend on the rest of its batch. A non-finite problem never converges and never holds the loop for the others.

Gradient (Prop. 5.2.2), exact at the fixed point and independent of the iteration count: stack ``X = [rho; pi]``,
``G = X * dL/dX``, ``sigma_j = sum_rows G_.j``, ``kappa = 1 / (1 - mu - n ||rho||^2)``,
``beta = -kappa (sum_j G_0j - n sigma^T rho)``, ``h = n (sigma + beta rho)``; then
``dL/dc_kj = -(1/epsilon) (G_kj - pi_kj h_j)``. As the selection sharpens every ``rho_j`` tends to 0 or ``1/n``
and ``1 - mu - n ||rho||^2`` to 0, so that formula divides two vanishing, cancellation-ridden differences. It is
evaluated here in the algebraically equal form (using ``rho_j + q_j = 1/n``, ``q_j = sum_k pi_kj``)

    beta = sum_j w_j (Dbar_j - dL/drho_j) / sum_j w_j,   w_j = rho_j q_j,   Dbar_j = sum_k (pi_kj / q_j) dL/dpi_kj,
    dL/dc_kj = -(1/epsilon) pi_kj [(dL/dpi_kj - Dbar_j) + n rho_j (Dbar_j - dL/drho_j - beta)],

a weighted average (``w`` normalized by a softmax of ``log w``) of bounded terms: finite for every ``epsilon``, with
no ``kappa`` to overflow (``kappa = 1 / (n sum_j w_j)``).

``mu = 1`` is global average pooling's limit: ``rho = 0`` and ``pi_kj = K_kj / (n s_j)``; it is returned in
closed form (the fixed point is only reached as ``t -> infinity`` there).

Written in ``keras.ops``: one definition runs on TensorFlow, JAX and PyTorch. The implicit gradient is two
``keras.ops.custom_gradient`` functions, one for ``rho`` and one for ``pi`` (Prop. 5.2.2 is linear in
``(dL/drho, dL/dpi)``, so their cost gradients add up to the formula above); the unrolled mode differentiates the
loop itself, through a loop with a static bound on JAX (whose ``while_loop`` has no reverse-mode gradient; each
problem still freezes at its threshold, so the results are the same). An eager TensorFlow caller gets the loop
compiled into one graph (:func:`ot_layers.backends.run_solver_loop`).
"""
import math
from typing import NamedTuple

import keras
from keras import ops

from ot_layers.backends import custom_gradient, run_solver_loop
from ot_layers.solvers.sinkhorn import has_converged, initial_error, per_problem_loop
from ot_layers.tensor_ops import compute_dtype, dtype_name
from ot_layers.validation import check_choice, check_in_range, check_non_negative, check_positive, check_positive_int


class PartialTransportResult(NamedTuple):
    """Solution of (P2) (float32, or float64 for float64 costs, except the counts and flags).

    residual: ``rho`` ``(B, n)``, the mass of each element left untransported.
    plan: ``pi`` ``(B, m, n)``, the mass each element sends to each prototype (sums to ``mu`` exactly).
    scale: ``t`` ``(B,)``, the scaling of Prop. 5.2.1 relative to the column sums divided by their maximum.
    iterations: ``(B,)`` int32, the iterations each problem ran before it met ``threshold`` (or ``max_iter``; 0 for
      ``mu = 1``). A non-finite problem runs as long as the batch's loop.
    error: ``(B,)`` column-marginal error ``sum_j |rho_j + sum_k pi_kj - 1/n|`` of the returned solution, or the
      plan's mass error ``|sum pi - mu|`` where that is larger than ``1e-3 mu`` (precision lost at extreme
      ``cost / epsilon``; ``MASS_TOLERANCE``).
    converged: ``(B,)`` bool, ``error`` is finite and at most ``threshold`` (at most
      ``sinkhorn.FIXED_ITERATIONS_TOLERANCE`` when ``threshold`` is 0); always true for ``mu = 1``.
    """

    residual: object
    plan: object
    scale: object
    iterations: object
    error: object
    converged: object


GRADIENTS = ("implicit", "unrolled")
METHODS = ("newton", "fixed_point")

__all__ = ["GRADIENTS", "METHODS", "PartialTransportResult", "compute_dtype", "partial_transport"]


def _log_size(x):
    """``log n`` for the size ``n`` of the last axis of ``x`` (known or not), in ``x``'s dtype."""
    return ops.log(ops.cast(ops.shape(x)[-1], dtype_name(x)))


def _log_residual(log_t, log_s, log_n):
    return -log_n - ops.softplus(log_t + log_s)


def _marginal_error(log_t_prev, log_t, transport_ratio):
    """``(B,)`` column-marginal error ``mu |1 - t_prev / t|`` of the solution built from ``(log_t_prev, log_t)``."""
    return transport_ratio * ops.abs(ops.exp(log_t_prev - log_t) - 1.0)[:, 0]  # (no Expm1 in ONNX)


def _loop_start(log_t):
    """The loop's first index, error (the largest finite number, so that the loop is entered) and update counts, for
    scalings ``log_t`` ``(B, 1)``."""
    return ops.convert_to_tensor(0, "int32"), initial_error(log_t), ops.zeros_like(log_t, dtype="int32")


def _fixed_point(log_s, log_n, log_mu, transport_ratio, max_iter, threshold, differentiable):
    """Prop. 5.2.1 as published: ``log t <- log mu - log g(log t) + log t``, a contraction of rate ``1 - slope``
    (``slope = d log g / d log t`` at the solution), slow where the selection is sharp."""

    def step(i, error, log_t_prev, log_t, count):
        """One update of ``t``; ``error`` is that of the updated state ``(log_t, new)``."""
        new = log_mu - ops.logsumexp(log_s + _log_residual(log_t, log_s, log_n), axis=-1, keepdims=True)
        return i + 1, _marginal_error(log_t, new, transport_ratio), log_t, new, count + 1

    log_t0 = ops.zeros_like(log_s[:, :1])  # t = 1 (for the column sums divided by their maximum)
    index0, error0, count0 = _loop_start(log_t0)
    _, _, log_t_prev, log_t, count = per_problem_loop(step, (index0, error0, log_t0, log_t0, count0), max_iter,
                                                      threshold, differentiable)
    return count[:, 0], log_t_prev, log_t


def _scaling_bounds(log_s, log_n, transport_ratio):
    """``(low, high)`` ``(B, 1)``: ``log t`` bounds between which the transported mass ``g`` crosses ``mu``.

    ``g(log t) = (1/n) sum_j sigmoid(log t + log s_j)`` grows from 0 to 1. From ``sigmoid(x) <= exp(x)`` and
    ``sigmoid(x) <= sigmoid(max)``, ``g <= mu`` at ``log mu - logmeanexp(log s)`` and at ``logit(mu) - max log s``;
    from ``1 - sigmoid(x) <= exp(-x)`` and ``sigmoid(x) >= sigmoid(min)``, ``g >= mu`` at ``-log(1 - mu) +
    logmeanexp(-log s)`` and at ``logit(mu) - min log s``. The tighter of each pair is taken."""
    dtype = dtype_name(log_s)
    logit_mu = ops.convert_to_tensor(math.log(transport_ratio / (1.0 - transport_ratio)), dtype)
    log_mu = ops.convert_to_tensor(math.log(transport_ratio), dtype)
    log_rest = ops.convert_to_tensor(math.log1p(-transport_ratio), dtype)
    low = ops.maximum(logit_mu - ops.max(log_s, axis=-1, keepdims=True),
                      log_mu - ops.logsumexp(log_s, axis=-1, keepdims=True) + log_n)
    high = ops.minimum(logit_mu - ops.min(log_s, axis=-1, keepdims=True),
                       ops.logsumexp(-log_s, axis=-1, keepdims=True) - log_n - log_rest)
    return low, high


# Smallest slope ``d log g / d log t`` a Newton step divides by; a smaller one gives a step far outside any bracket
# (so the midpoint is taken) without overflowing float32.
SLOPE_FLOOR = 1e-30


def _newton(log_s, log_n, log_mu, transport_ratio, max_iter, threshold, differentiable):
    """The root of ``log g(log t) = log mu`` by Newton's method in ``log t``, kept inside a bracket that every
    evaluation narrows (a step leaving it is replaced by the bracket's midpoint). The fixed point is Prop. 5.2.1's:
    its update is this Newton step with the slope ``d log g / d log t`` (in (0, 1)) taken as 1, so Newton's step is
    the update divided by the slope, and converges quadratically where the update crawls.

    Each evaluation at a candidate ``x`` gives Prop. 5.2.1's update ``w`` of it, so the loop state holds the pair
    ``(x, w)`` the solution is built from (residual from ``x``, plan from ``w``: the plan's mass is ``mu`` exactly),
    its error ``mu |1 - exp(x - w)| = |g(x) - mu|``, the bracket, and the next candidate."""

    def step(i, error, log_t_prev, log_t, low, high, candidate, count):
        z = candidate + log_s
        log_selected = -ops.softplus(-z)  # log sigmoid(z): the share of element j's mass transported
        log_total = ops.logsumexp(log_selected, axis=-1, keepdims=True)
        log_g = log_total - log_n
        # log sigmoid(z) (1 - sigmoid(z)) = 2 log sigmoid(z) - z
        slope = ops.exp(ops.logsumexp(2.0 * log_selected - z, axis=-1, keepdims=True) - log_total)
        new = log_mu - log_g + candidate
        error = _marginal_error(candidate, new, transport_ratio)
        below = log_g < log_mu
        low = ops.where(below, candidate, low)
        high = ops.where(below, high, candidate)
        # The slope is floored away from 0 (a step through an underflowed slope would be infinite) and held constant
        # for the unrolled gradient: its term carries the factor ``new - candidate``, which vanishes at the root, and
        # its derivative ``1 / slope^2`` overflows float32 for sharp selections.
        slope = ops.stop_gradient(ops.maximum(slope, SLOPE_FLOOR))
        newton = candidate + (new - candidate) / slope
        inside = ops.logical_and(newton >= low, newton <= high)  # False for a NaN or infinite step
        following = ops.where(inside, newton, 0.5 * (low + high))
        return i + 1, error, candidate, new, low, high, following, count + 1

    low, high = _scaling_bounds(log_s, log_n, transport_ratio)
    index0, error0, count0 = _loop_start(low)
    start = (index0, error0, low, low, low, high, low, count0)
    _, _, log_t_prev, log_t, _, _, _, count = per_problem_loop(step, start, max_iter, threshold, differentiable)
    return count[:, 0], log_t_prev, log_t


_SCALING_SOLVERS = {"newton": _newton, "fixed_point": _fixed_point}


def _relative_column_sums(logits):
    """``(log_s, shift)``: the kernel's log column sums ``log s_j`` less ``shift = max_j log s_j`` ``(B, 1)`` (a
    constant of the cost, no gradient). Scalings relative to it stay near 0 in float32, where ``log t`` itself (near
    ``-max_j log s_j``, hundreds at small ``epsilon``) would carry an absolute rounding of ~1e-5, and with it the
    transported mass, beyond the default threshold."""
    log_s = ops.logsumexp(logits, axis=1)  # (B, n)
    shift = ops.stop_gradient(ops.max(log_s, axis=-1, keepdims=True))
    return log_s - shift, shift


def _scalings(cost, transport_ratio, epsilon, max_iter, threshold, method, differentiable=False):
    """The scalings of (P2) on a batched cost ``(B, m, n)`` in the log domain, relative to the largest column sum
    (``t = 1`` for the column sums divided by their maximum), each problem stopping at its own threshold.

    Returns ``(iterations, log_t_prev, log_t)``: ``iterations`` ``(B,)`` counts the evaluations each problem ran,
    ``log rho`` is computed from ``log t_prev`` (``(B, 1)``), the plan from ``log t``, Prop. 5.2.1's update of it.
    The loop is Sinkhorn's (``per_problem_loop``): a problem whose error is at most ``threshold`` is frozen while the
    others iterate, so it ends exactly where it would end solved alone. ``differentiable`` asks for a loop the
    backend can reverse-differentiate (the unrolled gradient; a static-bound loop on JAX).
    """
    log_s, _ = _relative_column_sums(-cost / epsilon)
    log_n = _log_size(cost)
    log_mu = ops.convert_to_tensor(math.log(transport_ratio), dtype_name(cost))
    solve = _SCALING_SOLVERS[method]
    return solve(log_s, log_n, log_mu, transport_ratio, max_iter, threshold, differentiable)


def _solution(cost, epsilon, log_t_prev, log_t):
    """``(logits, log_rho, rho, plan)`` for the relative scalings ``log_t_prev`` (residual) and ``log_t`` (plan);
    the logits are relative too."""
    logits = -cost / epsilon
    log_s, shift = _relative_column_sums(logits)
    logits = logits - shift[:, :, None]
    log_rho = _log_residual(log_t_prev, log_s, _log_size(cost))
    plan = ops.exp(log_t[:, :, None] + logits + log_rho[:, None, :])
    return logits, log_rho, ops.exp(log_rho), plan


def _implicit_cost_gradient(logits, log_rho, log_t, rho, plan, d_rho, d_plan, epsilon):
    """``dL/dc`` of Prop. 5.2.2 in the guarded form of the module docstring; ``d_rho`` or ``d_plan`` may be ``None``
    (no gradient on that output: the formula is linear in the two, so the terms of a missing one are left out)."""
    n = ops.cast(ops.shape(rho)[-1], dtype_name(rho))
    log_w = 2.0 * log_rho + log_t + ops.logsumexp(logits, axis=1)  # log rho_j + log q_j, q_j = t s_j rho_j
    weights = ops.softmax(log_w, axis=-1)
    if d_plan is None:
        d_bar, centred = None, -d_rho
    else:
        column_softmax = ops.softmax(logits, axis=1)  # pi_kj / q_j
        d_bar = ops.sum(column_softmax * d_plan, axis=1)  # (B, n)
        centred = d_bar if d_rho is None else d_bar - d_rho  # Dbar_j - dL/drho_j
    beta = ops.sum(weights * centred, axis=-1, keepdims=True)  # (B, 1)
    inner = (n * rho * (centred - beta))[:, None, :]
    if d_bar is not None:
        inner = (d_plan - d_bar[:, None, :]) + inner
    return -(plan * inner) / epsilon


def _implicit_residual_and_plan(cost, log_t_prev, log_t, epsilon):
    """``rho`` and ``pi`` of the converged scalings (constants), each with its part of Prop. 5.2.2's gradient.

    Two single-output custom-gradient functions (Keras' PyTorch backend takes one output): ``rho``'s sends back
    ``dL/dc`` for ``dL/dpi = 0``, ``pi``'s for ``dL/drho = 0``; by linearity their sum is Prop. 5.2.2's ``dL/dc``.
    """

    def solution_with_gradient(output, cost, log_t_prev, log_t):
        logits, log_rho, rho, plan = _solution(cost, epsilon, log_t_prev, log_t)

        def grad(upstream):
            d_rho, d_plan = (upstream, None) if output == "residual" else (None, upstream)
            d_cost = _implicit_cost_gradient(logits, log_rho, log_t, rho, plan, d_rho, d_plan, epsilon)
            return d_cost, ops.zeros_like(log_t_prev), ops.zeros_like(log_t)

        return (rho if output == "residual" else plan), grad

    residual_of = custom_gradient(lambda *args: solution_with_gradient("residual", *args))
    plan_of = custom_gradient(lambda *args: solution_with_gradient("plan", *args))
    return residual_of(cost, log_t_prev, log_t), plan_of(cost, log_t_prev, log_t)


def _solve_implicit(cost, transport_ratio, epsilon, max_iter, threshold, method):
    iterations, log_t_prev, log_t = run_solver_loop(_scalings, ops.stop_gradient(cost), transport_ratio, epsilon,
                                                    max_iter, threshold, method)
    log_t_prev, log_t = ops.stop_gradient(log_t_prev), ops.stop_gradient(log_t)
    rho, plan = _implicit_residual_and_plan(cost, log_t_prev, log_t, epsilon)
    return rho, plan, log_t_prev, log_t, iterations


def _solve_unrolled(cost, transport_ratio, epsilon, max_iter, threshold, method):
    iterations, log_t_prev, log_t = run_solver_loop(_scalings, cost, transport_ratio, epsilon, max_iter, threshold,
                                                    method, True)
    _, _, rho, plan = _solution(cost, epsilon, log_t_prev, log_t)
    return rho, plan, log_t_prev, log_t, iterations


# The plan's mass is ``mu`` by construction (``t`` is updated so that ``t s^T rho = mu``) up to round-off; a relative
# deviation beyond this means the scalings lost their precision (costs over ``epsilon`` near 1e10 in float32, where
# ``log t + log s`` keeps no digit of the difference), and the fixed-point error, then 0, is not the error.
MASS_TOLERANCE = 1e-3


def _with_mass_failure(error, plan, transport_ratio):
    """``error``, or the plan's mass error ``|sum pi - mu|`` where that exceeds ``MASS_TOLERANCE * mu`` (and
    ``error``), so that a problem solved without precision is not reported converged."""
    mass_error = ops.abs(ops.sum(plan, axis=(1, 2)) - transport_ratio)
    failed = ops.logical_and(mass_error > MASS_TOLERANCE * transport_ratio, mass_error > error)
    return ops.where(failed, ops.stop_gradient(mass_error), error)


def _average_pooling_limit(cost, epsilon):
    """``mu = 1``: no residual; every element sends its mass ``1/n`` to the prototypes by a softmax over them."""
    n = ops.cast(ops.shape(cost)[-1], dtype_name(cost))
    plan = ops.softmax(-cost / epsilon, axis=1) / n
    per_problem = plan[:, 0, 0]
    error = ops.zeros_like(per_problem)
    return PartialTransportResult(ops.zeros_like(plan[:, 0, :]), plan, ops.full_like(per_problem, float("inf")),
                                  ops.zeros_like(per_problem, dtype="int32"), error, ops.isfinite(error))


def partial_transport(cost, transport_ratio=0.3, *, epsilon=0.2, max_iter=100, threshold=1e-6,
                      gradient="implicit", method="newton"):
    """Solve GSP's entropic partial transport (P2) for ``cost`` ``(m, n)`` or batched ``(B, m, n)``, on any Keras
    backend (TensorFlow, JAX, PyTorch).

    Args:
      cost: ``(m, n)`` or ``(B, m, n)`` floating costs (prototypes x elements). Computed in float32 (float64 for
        float64 input); float16/bfloat16 input is promoted.
      transport_ratio: ``mu`` in (0, 1], the share of the mass transported (Python float, layer configuration).
      epsilon: entropic regularization ``> 0`` (``1 / gamma``; 0.2 is the thesis' pair-loss setting
        ``gamma = 5``, 2.0 its proxy-loss setting ``gamma = 0.5``). Smaller is a sharper, top-k-like selection.
      max_iter: bound on the evaluations of Prop. 5.2.1's update (also XLA's ``maximum_iterations``).
      threshold: each problem stops once its own column-marginal error is at most this (frozen while the rest of
        the batch iterates); ``0`` runs exactly ``max_iter``.
      gradient: ``"implicit"`` (Prop. 5.2.2, memory and time independent of the iteration count) or
        ``"unrolled"`` (autodiff through the iterations; on JAX a loop of ``max_iter`` steps in which converged
        problems stay frozen). No gradient flows to ``scale``.
      method: how the scaling ``t`` is found, both ending at Prop. 5.2.1's fixed point: ``"newton"`` (safeguarded
        Newton steps in ``log t``; a handful of evaluations even where the selection is sharp) or
        ``"fixed_point"`` (Prop. 5.2.1's update as published, linear convergence that slows as ``epsilon``
        falls: hundreds to thousands of iterations at ``epsilon = 0.01``).

    Returns:
      ``PartialTransportResult(residual, plan, scale, iterations, error, converged)``, with the batch axis only if
      ``cost`` had one.
    """
    transport_ratio = float(check_in_range("transport_ratio", transport_ratio, 0.0, 1.0, low_open=True))
    epsilon = float(check_positive("epsilon", epsilon))
    max_iter = check_positive_int("max_iter", max_iter)
    threshold = float(check_non_negative("threshold", threshold))
    check_choice("gradient", gradient, GRADIENTS)
    check_choice("method", method, METHODS)
    cost = ops.convert_to_tensor(cost)
    if len(cost.shape) not in (2, 3):
        raise ValueError(f"`cost` must have shape (m, n) or (B, m, n), got {tuple(cost.shape)}.")
    if 0 in tuple(cost.shape[-2:]):
        raise ValueError(f"`cost` must have m >= 1 prototypes and n >= 1 features, got shape {tuple(cost.shape)}.")
    if not keras.backend.is_float_dtype(dtype_name(cost)):
        raise ValueError(f"`cost` must be a floating tensor, got {dtype_name(cost)}.")
    cost = ops.cast(cost, compute_dtype(cost.dtype))
    batched = len(cost.shape) == 3
    if not batched:
        cost = cost[None]
    if transport_ratio == 1.0:
        result = _average_pooling_limit(cost, epsilon)
    else:
        solve = _solve_implicit if gradient == "implicit" else _solve_unrolled
        rho, plan, log_t_prev, log_t, iterations = solve(cost, transport_ratio, epsilon, max_iter, threshold,
                                                          method)
        log_t_prev, log_t = ops.stop_gradient(log_t_prev), ops.stop_gradient(log_t)
        error = _with_mass_failure(_marginal_error(log_t_prev, log_t, transport_ratio), plan, transport_ratio)
        converged = has_converged(error, threshold)
        result = PartialTransportResult(rho, plan, ops.exp(log_t)[:, 0], iterations, error, converged)
    if not batched:
        result = PartialTransportResult(*(field[0] for field in result))
    return result
