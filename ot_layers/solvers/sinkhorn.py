"""Batched entropic optimal transport (Sinkhorn iterations, Cuturi 2013).

Solves, independently for every leading index of ``cost`` ``(..., n, m)``::

    min_T <C, T> + eps * sum T (log T - 1)   s.t.  T 1 = a,  T^T 1 = b,  T >= 0

by alternating scaling updates, either in the log domain (always safe)::

    f <- eps log a - eps LSE_j((g_j - C_ij) / eps),   g <- eps log b - eps LSE_i((f_i - C_ij) / eps)

or in the kernel domain (matrix-vector products only; used while ``(max C - min C) / eps`` is small enough for
``exp(-C / eps)`` not to underflow)::

    K = exp(-C / eps),   u <- a / (K v),   v <- b / (K^T u),   T = diag(u) K diag(v).

The plan is ``T_ij = exp((f_i + g_j - C_ij) / eps)`` in both cases (``f = eps log u``, ``g = eps log v``).

Gradients:
- ``"unrolled"``: autodiff through every iteration (memory grows with the iteration count);
- ``"implicit"``: the implicit function theorem at the fixed point (memory independent of the iteration count).
  Writing ``H = [[diag(a), T], [T^T, diag(b)]]`` for the Jacobian of the marginal constraints in ``(f, g)``, the
  adjoint ``H [x; y] = [(G*T) 1; (G*T)^T 1]`` gives, for an upstream gradient ``G`` on the plan,
  ``dL/dC = T * (x_i + y_j - G_ij) / eps``, ``dL/da = x``, ``dL/db = y``; the entropic value
  ``W = <C, T> + eps sum T (log T - 1)`` gets Danskin's gradients ``dW/dC = T``, ``dW/da = f``, ``dW/db = g``.
  Gradients for ``a`` and ``b`` are centred (only mass-preserving perturbations of the marginals are defined).

Zero-mass entries (``a_i = 0`` or ``b_j = 0``) are solved as the problem with those rows / columns removed: their
plan rows / columns are exactly zero, the value, the other entries and all gradients are those of the reduced
problem (centring runs over the positive entries). With the entropy ``sum T (log T - 1)`` the true derivative of the
value along a zero entry is ``-inf`` (``f_i = eps log a_i + ...``); the gradient reported there is 0, and the
potential reported there is the soft c-transform ``f_i = -eps LSE_j((g_j - C_ij) / eps)`` (the potential the row
would have with unit mass), so every output is finite. A problem whose marginals are all zero has a zero plan, value
and potentials.

Each problem stops at its own threshold (its variables freeze while the others iterate), so a batch's results equal
each problem's solved alone. NaN or Inf in one problem stays in that problem: the stopping test ignores problems whose
error is not finite, the ``"auto"`` domain choice ignores NaN costs, and the implicit gradient's linear solve is
isolated per problem.
"""
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from ot_layers.validation import check_choice, check_non_negative, check_positive, check_positive_int

# exp(-x) stays a normal number for x below ~87 in float32 and ~708 in float64; keep a safety margin so that the
# scaled vectors u, v (which grow like exp(+x)) stay finite too.
KERNEL_DOMAIN_LIMIT = {tf.float32: 30.0, tf.float64: 300.0}
# log(a_i) stands at this value for a zero-mass entry inside the log-domain loop: exp(LOG_ZERO + ...) is exactly 0 in
# float32 and float64 while every potential stays finite (no -inf arithmetic, no NaN gradient).
LOG_ZERO = -1.0e4
DOMAINS = ("auto", "log", "kernel")
GRADIENTS = ("implicit", "unrolled")


class SinkhornResult(NamedTuple):
    """What :func:`sinkhorn` returns (all in the compute dtype, float32 or float64).

    plan: ``(..., n, m)`` transport plan.
    f, g: ``(..., n)``, ``(..., m)`` dual potentials (``T = exp((f + g - C) / eps)``).
    value: ``(...)`` entropic OT value ``<C, T> + eps sum T (log T - 1)``.
    transport_cost: ``(...)`` ``<C, T>``, the plan-weighted cost.
    iterations: scalar int32, the number of scaling updates run.
    error: ``(...)`` final row-marginal error ``sum_i |T 1 - a|_i / sum_i a_i`` (columns are met exactly).

    For zero-mass entries the plan rows / columns are exactly zero and ``f``, ``g`` there hold the soft c-transform
    (see the module docstring).
    """

    plan: tf.Tensor
    f: tf.Tensor
    g: tf.Tensor
    value: tf.Tensor
    transport_cost: tf.Tensor
    iterations: tf.Tensor
    error: tf.Tensor


def compute_dtype(dtype):
    """Sinkhorn runs in float64 for float64 input and in float32 otherwise (also under mixed precision)."""
    return tf.float64 if dtype == tf.float64 else tf.float32


def _tiny(dtype):
    return np.finfo(dtype.as_numpy_dtype).tiny


def _marginal_error(row_sums, a):
    mass = tf.reduce_sum(a, axis=-1)
    return tf.reduce_sum(tf.abs(row_sums - a), axis=-1) / tf.maximum(mass, _tiny(a.dtype))


def _initial_error(a):
    # Finite, so that the stopping test (which ignores non-finite errors) enters the loop.
    return tf.fill(tf.shape(a)[:-1], tf.constant(np.finfo(a.dtype.as_numpy_dtype).max, a.dtype))


def per_problem_loop(body, state, max_iter, threshold):
    """Runs ``body`` until every problem's marginal error is <= ``threshold`` or ``max_iter`` updates were made.

    ``state`` = (iteration, error, *variables), ``body`` measures the error of the variables it receives, then updates
    them. A problem stops being updated once its own error is <= ``threshold`` (its variables are frozen while the
    others go on), so each problem ends exactly where it would end solved alone: a served model's output for an
    input does not depend on the rest of its batch. ``maximum_iterations`` makes the loop differentiable under XLA.
    A problem whose error is NaN or Inf (NaN/Inf input) never converges; it does not hold the loop for the others, and
    a NaN never decides the test for the batch (``max`` over a batch holding a NaN would be NaN, ``NaN > t`` False).
    ``error`` has the batch shape ``(...)``, every variable one more axis ``(..., k)`` (the mask is broadcast over it).
    Shared with ``partial_transport`` (GSP's solver), whose scaling stops per problem the same way.
    """
    if threshold is None or threshold == 0:
        return tf.while_loop(lambda i, *_: i < max_iter, body, state, maximum_iterations=max_iter)

    def converged(error):
        return tf.logical_and(tf.math.is_finite(error), error <= threshold)

    def cond(i, error, *_):
        pending = tf.logical_and(tf.math.is_finite(error), error > threshold)
        return tf.logical_and(i < max_iter, tf.reduce_any(pending))

    def body_of_pending_problems(i, error, *variables):
        done = converged(error)  # measured on ``variables`` by the previous step: a lone solve would have stopped
        i, new_error, *updated = body(i, error, *variables)
        kept = [tf.where(done[..., None], old, new) for old, new in zip(variables, updated)]
        return (i, tf.where(done, error, new_error), *kept)

    return tf.while_loop(cond, body_of_pending_problems, state, maximum_iterations=max_iter)


def _masked_log(x, positive):
    """``log x`` where ``positive``, ``LOG_ZERO`` elsewhere, with a zero (not NaN) gradient at the masked entries."""
    return tf.where(positive, tf.math.log(tf.where(positive, x, tf.ones_like(x))), tf.constant(LOG_ZERO, x.dtype))


def _solve_log(cost, a, b, epsilon, max_iter, threshold):
    log_a, log_b = _masked_log(a, tf.not_equal(a, 0)), _masked_log(b, tf.not_equal(b, 0))
    f = tf.zeros_like(a)
    g = tf.zeros_like(b)

    def body(i, error, f, g):
        row_lse = tf.reduce_logsumexp((g[..., None, :] - cost) / epsilon, axis=-1)
        error = _marginal_error(tf.exp(f / epsilon + row_lse), a)
        f = epsilon * (log_a - row_lse)
        g = epsilon * (log_b - tf.reduce_logsumexp((f[..., :, None] - cost) / epsilon, axis=-2))
        return i + 1, error, f, g

    i, _, f, g = per_problem_loop(body, (tf.constant(0), _initial_error(a), f, g), max_iter, threshold)
    return f, g, i


def _in_xla_context():
    """True while tracing a ``jit_compile=True`` function (uses TF's internal XLA-context marker)."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - the internal module moved
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def _matvec(matrix, vector, transpose=False):
    """``matrix @ vector`` (``matrix^T @ vector`` with ``transpose``) over batches of small matrices.

    XLA on CPU runs batched small matrix-vector products several times slower as dots than as fused
    multiply-and-sum, while TensorFlow's own kernels favour ``matvec``: the form is picked by context at trace time.
    """
    if not _in_xla_context():
        return tf.linalg.matvec(matrix, vector, transpose_a=transpose)
    if transpose:
        return tf.reduce_sum(matrix * vector[..., :, None], axis=-2)
    return tf.reduce_sum(matrix * vector[..., None, :], axis=-1)


def _solve_kernel(cost, a, b, epsilon, max_iter, threshold):
    # Shifting each problem's cost by its minimum leaves the plan unchanged and keeps exp(-C/eps) <= 1.
    shift = tf.reduce_min(cost, axis=[-2, -1])
    kernel = tf.exp(-(cost - shift[..., None, None]) / epsilon)
    u = tf.ones_like(a)
    v = tf.ones_like(b)

    def body(i, error, u, v):
        kv = _matvec(kernel, v)
        error = _marginal_error(u * kv, a)
        u = a / kv
        v = b / _matvec(kernel, u, transpose=True)
        return i + 1, error, u, v

    i, _, u, v = per_problem_loop(body, (tf.constant(0), _initial_error(a), u, v), max_iter, threshold)
    # Zero-mass entries have u_i = 0 (v_j = 0): their potentials are filled in later (_fill_zero_mass).
    f = epsilon * _masked_log(u, tf.not_equal(a, 0)) + shift[..., None]
    g = epsilon * _masked_log(v, tf.not_equal(b, 0))
    return f, g, i


def _solve(cost, a, b, epsilon, max_iter, threshold, domain):
    if domain == "log":
        return _solve_log(cost, a, b, epsilon, max_iter, threshold)
    if domain == "kernel":
        return _solve_kernel(cost, a, b, epsilon, max_iter, threshold)
    spread = tf.reduce_max(cost, axis=[-2, -1]) - tf.reduce_min(cost, axis=[-2, -1])
    # A NaN problem must not decide the domain of the others (reduce_max propagates NaN).
    spread = tf.reduce_max(tf.where(tf.math.is_nan(spread), tf.zeros_like(spread), spread))
    safe = spread / epsilon < KERNEL_DOMAIN_LIMIT[cost.dtype]
    return tf.cond(
        safe,
        lambda: _solve_kernel(cost, a, b, epsilon, max_iter, threshold),
        lambda: _solve_log(cost, a, b, epsilon, max_iter, threshold),
    )


# Eager callers get the loop as one graph (an eager tf.while_loop runs as a slow Python loop). Inside a traced
# function the loop is built in place: a nested function call would break XLA's gradient of the unrolled loop.
_solve_graph = tf.function(_solve, reduce_retracing=True)


def _solve_compiled(*args):
    return _solve_graph(*args) if tf.executing_eagerly() else _solve(*args)


def _support(a, b):
    """Entries that carry mass (NaN counts as mass, so that NaN input stays visible), as an ``(..., n, m)`` mask."""
    return tf.logical_and(tf.not_equal(a, 0)[..., :, None], tf.not_equal(b, 0)[..., None, :])


def _plan(cost, f, g, epsilon, support):
    # The masked exponent (not a masked exp) keeps the gradient of the discarded entries at 0 instead of 0 * inf.
    exponent = tf.where(support, (f[..., :, None] + g[..., None, :] - cost) / epsilon,
                        tf.constant(LOG_ZERO, cost.dtype))
    return tf.where(support, tf.exp(exponent), tf.zeros_like(cost))


def _safe_marginals(a, b):
    """Problems with no mass at all are solved with uniform marginals (their plan is masked to zero afterwards), and
    zero entries are constants (a zero gradient there, in the kernel domain's unrolled loop too)."""
    a = tf.where(tf.equal(a, 0), tf.stop_gradient(a), a)
    b = tf.where(tf.equal(b, 0), tf.stop_gradient(b), b)
    empty = tf.equal(tf.reduce_sum(tf.abs(a), axis=-1), 0)[..., None]
    uniform_a = tf.ones_like(a) / tf.cast(tf.shape(a)[-1], a.dtype)
    uniform_b = tf.ones_like(b) / tf.cast(tf.shape(b)[-1], b.dtype)
    return tf.where(empty, uniform_a, a), tf.where(empty, uniform_b, b), empty


def _fill_zero_mass(cost, f, g, a, b, epsilon, empty):
    """Soft c-transforms at zero-mass entries (finite, and what the potential would be with unit mass); zeros for
    problems without mass."""
    zero_a, zero_b = tf.equal(a, 0), tf.equal(b, 0)
    log_mask_b = tf.where(zero_b, tf.constant(LOG_ZERO, cost.dtype), tf.zeros_like(b))
    g_support = tf.where(zero_b, tf.zeros_like(g), g)
    f_c = -epsilon * tf.reduce_logsumexp((g_support[..., None, :] - cost) / epsilon + log_mask_b[..., None, :], axis=-1)
    f = tf.where(zero_a, f_c, f)
    log_mask_a = tf.where(zero_a, tf.constant(LOG_ZERO, cost.dtype), tf.zeros_like(a))
    f_support = tf.where(zero_a, tf.zeros_like(f), f)
    g_c = -epsilon * tf.reduce_logsumexp((f_support[..., :, None] - cost) / epsilon + log_mask_a[..., :, None], axis=-2)
    g = tf.where(zero_b, g_c, g)
    return tf.where(empty, tf.zeros_like(f), f), tf.where(empty, tf.zeros_like(g), g)


def _entropic_value(plan, f, g, epsilon):
    # <C,T> + eps sum T (log T - 1) with log T = (f + g - C) / eps.
    return tf.reduce_sum(plan * (f[..., :, None] + g[..., None, :] - epsilon), axis=[-2, -1])


def _centred(x, positive):
    """``x`` minus its mean over the ``positive`` entries, and 0 at the others (zero-mass entries)."""
    count = tf.reduce_sum(tf.cast(positive, x.dtype), axis=-1, keepdims=True)
    mean = tf.reduce_sum(tf.where(positive, x, tf.zeros_like(x)), axis=-1, keepdims=True) / tf.maximum(count, 1.0)
    return tf.where(positive, x - mean, tf.zeros_like(x))


# Up to this size the Schur complement is solved by an unrolled Cholesky under XLA: XLA's CPU backend solves a
# batch of tiny systems about ten times slower than TensorFlow's own kernel, while elementwise work fuses well.
UNROLLED_SOLVE_MAX_SIZE = 8


def _unrolled_cholesky_solve(matrix, rhs):
    """Solves ``matrix x = rhs`` for a batch of small symmetric positive definite ``matrix`` ``(..., m, m)`` with a
    static ``m``, as elementwise operations on the batch (Cholesky, then forward and back substitution)."""
    m = matrix.shape[-1]
    tiny = _tiny(matrix.dtype)
    a = [[matrix[..., i, j] for j in range(m)] for i in range(m)]
    lower = [[None] * m for _ in range(m)]
    for j in range(m):
        diagonal = a[j][j] - sum((lower[j][k] ** 2 for k in range(j)), tf.zeros_like(a[j][j]))
        lower[j][j] = tf.sqrt(tf.maximum(diagonal, tiny))
        for i in range(j + 1, m):
            off = a[i][j] - sum((lower[i][k] * lower[j][k] for k in range(j)), tf.zeros_like(a[i][j]))
            lower[i][j] = off / lower[j][j]
    z = []
    for i in range(m):
        z.append((rhs[..., i] - sum((lower[i][k] * z[k] for k in range(i)), tf.zeros_like(rhs[..., i])))
                 / lower[i][i])
    x = [None] * m
    for i in reversed(range(m)):
        x[i] = (z[i] - sum((lower[k][i] * x[k] for k in range(i + 1, m)), tf.zeros_like(z[i]))) / lower[i][i]
    return tf.stack(x, axis=-1)


def _spd_solve(matrix, rhs):
    m = matrix.shape[-1]
    if _in_xla_context() and m is not None and m <= UNROLLED_SOLVE_MAX_SIZE:
        return _unrolled_cholesky_solve(matrix, rhs)
    # TensorFlow's solver raises for a batch holding one non-finite matrix: solve an identity there instead and give
    # that problem NaN, so NaN input stays in its own problem.
    bad = tf.logical_not(tf.reduce_all(tf.math.is_finite(matrix), axis=[-2, -1]))
    eye = tf.eye(tf.shape(matrix)[-1], batch_shape=tf.shape(matrix)[:-2], dtype=matrix.dtype)
    solution = tf.linalg.solve(tf.where(bad[..., None, None], eye, matrix), rhs[..., None])[..., 0]
    return tf.where(bad[..., None], tf.constant(np.nan, matrix.dtype), solution)


def _adjoint(plan, upstream):
    """Solves ``H [x; y] = [(G*T) 1; (G*T)^T 1]`` through the Schur complement on the column side.

    ``H = [[diag(r), T], [T^T, diag(c)]]`` with ``r, c`` the plan's own marginals; ``H`` is singular along
    ``(1, -1)``, which ``+ 1 1^T`` on the Schur complement ``diag(c) - T^T diag(1/r) T`` removes (the right-hand
    side is orthogonal to it).
    """
    weighted = upstream * plan
    rhs_rows = tf.reduce_sum(weighted, axis=-1)
    rhs_cols = tf.reduce_sum(weighted, axis=-2)
    rows = tf.maximum(tf.reduce_sum(plan, axis=-1), _tiny(plan.dtype))
    cols = tf.reduce_sum(plan, axis=-2)
    scaled = plan / rows[..., :, None]
    if _in_xla_context():  # see _matvec: fused multiply-and-sum beats XLA's small batched dots on CPU
        gram = tf.reduce_sum(plan[..., :, :, None] * scaled[..., :, None, :], axis=-3)
    else:
        gram = tf.linalg.matmul(plan, scaled, transpose_a=True)
    scale = tf.reduce_mean(cols, axis=-1, keepdims=True)
    scale = tf.where(scale > 0, scale, tf.ones_like(scale))
    # An empty column (zero mass, or all entries underflowed) has a zero row and column in the Schur complement; a
    # diagonal entry of the mean column mass there decouples it (its right-hand side is 0, so y_j = 0 exactly),
    # leaving the reduced problem's system.
    schur = tf.linalg.diag(tf.where(cols > 0, cols, scale)) - gram
    scale = scale[..., None]
    # + 1 1^T removes the gauge direction; a ridge of a few ulps keeps the solve finite when underflowed plan
    # entries split the problem into disconnected blocks (tiny epsilon, float32), each adding a null direction.
    ridge = 10.0 * np.finfo(plan.dtype.as_numpy_dtype).eps
    schur += scale * (tf.ones_like(schur) + ridge * tf.eye(tf.shape(schur)[-1], dtype=schur.dtype))
    y = _spd_solve(schur, rhs_cols - _matvec(scaled, rhs_rows, transpose=True))
    x = (rhs_rows - _matvec(plan, y)) / rows
    return x, y


def _implicit_plan_and_value(cost, a, b, f, g, epsilon):
    """Plan and entropic value from converged potentials, with fixed-point (implicit) gradients."""
    support = _support(a, b)
    positive_a, positive_b = tf.not_equal(a, 0), tf.not_equal(b, 0)

    @tf.custom_gradient
    def plan_and_value(cost, a, b):
        plan = _plan(cost, f, g, epsilon, support)
        value = _entropic_value(plan, f, g, epsilon)

        def grad(d_plan, d_value):
            n, m = plan.shape[-2], plan.shape[-1]
            if n is not None and m is not None and n < m:  # the Schur complement on the smaller side
                y, x = _adjoint(tf.linalg.matrix_transpose(plan), tf.linalg.matrix_transpose(d_plan))
            else:
                x, y = _adjoint(plan, d_plan)
            dv = d_value[..., None]
            d_cost = plan * (x[..., :, None] + y[..., None, :] - d_plan) / epsilon + dv[..., None] * plan
            return d_cost, _centred(x + dv * f, positive_a), _centred(y + dv * g, positive_b)

        return (plan, value), grad

    return plan_and_value(cost, a, b)


def _validate_marginal(name, marginal, expected_shape):
    if marginal.shape.rank is not None and marginal.shape.rank < 1:
        raise ValueError(f"`{name}` must have at least one dimension, got shape {marginal.shape}.")
    if expected_shape is not None and marginal.shape[-1] is not None and marginal.shape[-1] != expected_shape:
        raise ValueError(
            f"`{name}` has {marginal.shape[-1]} entries per problem but `cost` has {expected_shape} on that side."
        )
    if tf.executing_eagerly() and bool(tf.reduce_any(marginal < 0)):
        raise ValueError(f"`{name}` must be non-negative.")


def _uniform(cost, axis):
    size = tf.shape(cost)[axis]
    shape = tf.concat([tf.shape(cost)[:-2], [size]], axis=0)
    return tf.fill(shape, 1.0 / tf.cast(size, cost.dtype))


def prepare_problem(cost, a=None, b=None):
    """Validates a batch of transport problems and returns ``(cost, a, b)`` in the compute dtype.

    ``cost`` ``(..., n, m)``; marginals default to uniform, must be non-negative with equal sums per problem
    (checked when running eagerly) and are broadcast to the batch shape.
    """
    cost = tf.convert_to_tensor(cost)
    dtype = compute_dtype(cost.dtype)
    cost = tf.cast(cost, dtype)
    if cost.shape.rank is not None and cost.shape.rank < 2:
        raise ValueError(f"`cost` must have shape (..., n, m) with rank >= 2, got shape {cost.shape}.")
    a = _uniform(cost, -2) if a is None else tf.cast(tf.convert_to_tensor(a), dtype)
    b = _uniform(cost, -1) if b is None else tf.cast(tf.convert_to_tensor(b), dtype)
    _validate_marginal("a", a, cost.shape[-2])
    _validate_marginal("b", b, cost.shape[-1])
    if tf.executing_eagerly():
        sums_a, sums_b = tf.reduce_sum(a, axis=-1), tf.reduce_sum(b, axis=-1)
        gap = tf.reduce_max(tf.abs(sums_a - sums_b) / tf.maximum(sums_a, sums_b))
        if float(gap) > 1e-5:
            raise ValueError(f"`a` and `b` must have equal sums per problem (relative gap {float(gap):.3g}).")
    batch_shape = tf.shape(cost)[:-2]
    a = tf.broadcast_to(a, tf.concat([batch_shape, tf.shape(a)[-1:]], 0))
    b = tf.broadcast_to(b, tf.concat([batch_shape, tf.shape(b)[-1:]], 0))
    return cost, a, b


def sinkhorn(
    cost,
    a=None,
    b=None,
    *,
    epsilon=0.1,
    max_iter=100,
    threshold=1e-3,
    domain="auto",
    gradient="implicit",
):
    """Batched entropic OT between the rows and columns of ``cost`` (Cuturi 2013).

    Args:
      cost: ``(..., n, m)`` cost matrices; any leading dimensions are a batch.
      a, b: marginals ``(..., n)`` and ``(..., m)`` (broadcast against the batch); uniform ``1/n``, ``1/m`` when
        ``None``. Non-negative, with equal sums per problem; zero entries are allowed (their plan rows / columns
        are zero, see the module docstring).
      epsilon: entropic regularization ``> 0``.
      max_iter: hard bound on the scaling updates (also the ``maximum_iterations`` XLA needs).
      threshold: stop once every problem's row-marginal error ``sum |T 1 - a| / sum a`` is at most this; ``0`` or
        ``None`` runs exactly ``max_iter`` updates.
      domain: ``"log"``, ``"kernel"``, or ``"auto"`` (kernel while ``(max C - min C) / eps`` is below
        ``KERNEL_DOMAIN_LIMIT`` for the compute dtype, log otherwise). With ``gradient="unrolled"``, ``"auto"``
        means ``"log"``: autodiff through a data-dependent branch around the loop does not compile under XLA.
      gradient: ``"implicit"`` (fixed-point differentiation, constant memory) or ``"unrolled"`` (autodiff).

    Returns:
      :class:`SinkhornResult`, computed in float32 (float64 for float64 input) whatever the input dtype.
    """
    check_positive("epsilon", epsilon)
    max_iter = check_positive_int("max_iter", max_iter)
    if threshold is not None:
        check_non_negative("threshold", threshold)
    check_choice("domain", domain, DOMAINS)
    check_choice("gradient", gradient, GRADIENTS)

    cost, a, b = prepare_problem(cost, a, b)
    epsilon = tf.constant(epsilon, cost.dtype)
    a_solve, b_solve, empty = _safe_marginals(a, b)

    if gradient == "implicit":
        f, g, iterations = _solve_compiled(tf.stop_gradient(cost), tf.stop_gradient(a_solve),
                                           tf.stop_gradient(b_solve), epsilon, max_iter, threshold, domain)
        f, g = _fill_zero_mass(tf.stop_gradient(cost), f, g, a, b, epsilon, empty)
        f, g = tf.stop_gradient(f), tf.stop_gradient(g)
        plan, value = _implicit_plan_and_value(cost, a, b, f, g, epsilon)
    else:
        domain = "log" if domain == "auto" else domain
        f, g, iterations = _solve_compiled(cost, a_solve, b_solve, epsilon, max_iter, threshold, domain)
        f, g = _fill_zero_mass(cost, f, g, a, b, epsilon, empty)
        plan = _plan(cost, f, g, epsilon, _support(a, b))
        value = _entropic_value(plan, f, g, epsilon)
    transport_cost = tf.reduce_sum(plan * cost, axis=[-2, -1])
    error = _marginal_error(tf.reduce_sum(plan, axis=-1), a)
    return SinkhornResult(plan, f, g, value, transport_cost, iterations, error)
