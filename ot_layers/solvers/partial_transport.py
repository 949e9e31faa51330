"""Entropic partial transport with a residual, GSP's selection problem (paper 003, ch. 5, SPEC S3).

For a cost ``c`` ``(m, n)`` between ``m`` prototypes and ``n`` feature-map elements, transport ratio ``mu`` and
inverse temperature ``gamma`` (the thesis' ``epsilon``), problem (P2):

    min_{pi, rho >= 0}  <c, pi> + (1/gamma) (sum pi log pi + sum rho log rho)
    s.t.  rho_j + sum_k pi_kj = 1/n,   sum_kj pi_kj = mu.

Its solution is the fixed point of Prop. 5.2.1: with ``K = exp(-gamma c)`` and column sums ``s_j = sum_k K_kj``,
starting from ``t = 1``, iterate ``rho <- (1/n) / (1 + t s)`` and ``t <- mu / (s^T rho)``; the plan is
``pi = t K diag(rho)``. Only the ``n``-vector ``rho`` and the scalar ``t`` are iterated, ``K`` enters once.

Gradient (Prop. 5.2.2), exact at the fixed point and independent of the iteration count: stack ``X = [rho; pi]``,
``G = X * dL/dX``, ``sigma_j = sum_rows G_.j``, ``kappa = 1 / (1 - mu - n ||rho||^2)``,
``beta = -kappa (sum_j G_0j - n sigma^T rho)``, ``h = n (sigma + beta rho)``; then
``dL/dc_kj = -gamma (G_kj - pi_kj h_j)``.

``mu = 1`` is global average pooling's limit: ``rho = 0`` and ``pi_kj = K_kj / (n s_j)``; it is returned in
closed form (the fixed point is only reached as ``t -> infinity`` there, and ``kappa`` is infinite).
"""
import collections

import tensorflow as tf

from ot_layers.validation import check_choice, check_in_range, check_positive, check_positive_int

PartialTransportResult = collections.namedtuple("PartialTransportResult", ["residual", "plan", "scale"])
PartialTransportResult.__doc__ = """Solution of (P2).

residual: ``rho`` ``(B, n)``, the mass of each element left untransported.
plan: ``pi`` ``(B, m, n)``, the mass each element sends to each prototype (sums to ``mu``).
scale: ``t`` ``(B,)``, the scaling of Prop. 5.2.1 relative to the column sums divided by their maximum.
"""

GRADIENTS = ("closed_form", "autodiff")


def _fixed_point(cost, transport_ratio, inverse_temperature, max_iter):
    """Run Prop. 5.2.1 for ``max_iter`` iterations on a batched cost ``(B, m, n)``; returns ``(rho, pi, t)``.

    The column sums are divided by their per-problem maximum (computed in log space), which leaves ``rho`` and
    ``pi`` unchanged (only ``t`` absorbs the factor) and keeps ``exp`` from underflowing for large ``gamma c``.
    """
    logits = -inverse_temperature * cost
    log_column_sums = tf.reduce_logsumexp(logits, axis=1)  # (B, n)
    shift = tf.stop_gradient(tf.reduce_max(log_column_sums, axis=-1, keepdims=True))  # (B, 1)
    column_sums = tf.exp(log_column_sums - shift)
    n = tf.cast(tf.shape(cost)[-1], cost.dtype)

    def step(i, rho, t):
        rho = (1.0 / n) / (1.0 + t * column_sums)
        t = transport_ratio / tf.reduce_sum(column_sums * rho, axis=-1, keepdims=True)
        return i + 1, rho, t

    t0 = tf.ones_like(shift)
    rho0 = tf.zeros_like(column_sums)
    _, rho, t = tf.while_loop(lambda i, rho, t: i < max_iter, step, (tf.constant(0), rho0, t0),
                              maximum_iterations=max_iter)
    plan = t[:, :, None] * tf.exp(logits - shift[:, :, None]) * rho[:, None, :]
    return rho, plan, t[:, 0]


def _closed_form_cost_gradient(rho, plan, d_rho, d_plan, transport_ratio, inverse_temperature):
    """``dL/dc`` of Prop. 5.2.2 from the solution and the incoming gradients (see the module docstring)."""
    n = tf.cast(tf.shape(rho)[-1], rho.dtype)
    g_residual = rho * d_rho  # G_0.
    g_plan = plan * d_plan  # G_k.
    sigma = g_residual + tf.reduce_sum(g_plan, axis=1)  # (B, n)
    kappa = 1.0 / (1.0 - transport_ratio - n * tf.reduce_sum(rho * rho, axis=-1, keepdims=True))
    beta = -kappa * (tf.reduce_sum(g_residual, axis=-1, keepdims=True)
                     - n * tf.reduce_sum(sigma * rho, axis=-1, keepdims=True))
    h = n * (sigma + beta * rho)
    return -inverse_temperature * (g_plan - plan * h[:, None, :])


def _solve_closed_form(cost, transport_ratio, inverse_temperature, max_iter):
    @tf.custom_gradient
    def solve(cost):
        rho, plan, t = _fixed_point(cost, transport_ratio, inverse_temperature, max_iter)

        def grad(d_rho, d_plan, d_t):
            d_rho = tf.zeros_like(rho) if d_rho is None else d_rho
            d_plan = tf.zeros_like(plan) if d_plan is None else d_plan
            return _closed_form_cost_gradient(rho, plan, d_rho, d_plan, transport_ratio, inverse_temperature)

        return (rho, plan, tf.stop_gradient(t)), grad

    return solve(cost)


def _average_pooling_limit(cost, inverse_temperature):
    """``mu = 1``: no residual; every element sends its mass ``1/n`` to the prototypes by a softmax over them."""
    n = tf.cast(tf.shape(cost)[-1], cost.dtype)
    plan = tf.nn.softmax(-inverse_temperature * cost, axis=1) / n
    batch = tf.shape(cost)[0]
    return tf.zeros_like(plan[:, 0, :]), plan, tf.fill([batch], tf.constant(float("inf"), cost.dtype))


def partial_transport(cost, transport_ratio=0.3, inverse_temperature=5.0, max_iter=100, gradient="closed_form"):
    """Solve GSP's entropic partial transport (P2) for ``cost`` ``(m, n)`` or batched ``(B, m, n)``.

    ``transport_ratio`` ``mu`` in (0, 1] and ``inverse_temperature`` ``gamma`` > 0 are Python floats (layer
    configuration); ``max_iter`` iterations of Prop. 5.2.1 run (a fixed count, as in the thesis).
    ``gradient``: ``"closed_form"`` (Prop. 5.2.2, memory and time independent of ``max_iter``) or ``"autodiff"``
    (differentiates through the iterations). No gradient flows to ``scale``.
    Returns a ``PartialTransportResult(residual, plan, scale)`` with the batch axis only if ``cost`` had one.
    """
    transport_ratio = float(check_in_range("transport_ratio", transport_ratio, 0.0, 1.0, low_open=True))
    inverse_temperature = float(check_positive("inverse_temperature", inverse_temperature))
    max_iter = check_positive_int("max_iter", max_iter)
    check_choice("gradient", gradient, GRADIENTS)
    cost = tf.convert_to_tensor(cost)
    if cost.shape.rank not in (2, 3):
        raise ValueError(f"`cost` must have shape (m, n) or (B, m, n), got {cost.shape}.")
    if not cost.dtype.is_floating:
        raise ValueError(f"`cost` must be a floating tensor, got {cost.dtype.name}.")
    batched = cost.shape.rank == 3
    if not batched:
        cost = cost[None]
    if transport_ratio == 1.0:
        result = _average_pooling_limit(cost, inverse_temperature)
    elif gradient == "closed_form":
        result = _solve_closed_form(cost, transport_ratio, inverse_temperature, max_iter)
    else:
        result = _fixed_point(cost, transport_ratio, inverse_temperature, max_iter)
    result = PartialTransportResult(*result)
    if not batched:
        result = PartialTransportResult(*(r[0] for r in result))
    return result
