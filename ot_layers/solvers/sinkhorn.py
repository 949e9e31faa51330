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

A ``+inf`` cost forbids its pair: the plan entry is exactly 0, it adds 0 to ``transport_cost`` (not ``0 * inf``), and
its gradients are 0 (the problem equals one whose cost there is finite but large enough for ``exp(-C / eps)`` to be
0).

Each problem stops at its own threshold (its variables freeze while the others iterate), so a batch's results equal
each problem's solved alone. NaN or Inf in one problem stays in that problem: the stopping test ignores problems whose
error is not finite, the ``"auto"`` domain choice ignores NaN costs, and the implicit gradient's linear solve is
isolated per problem.

Written in ``keras.ops``: one definition runs on TensorFlow, JAX and PyTorch. The implicit gradients are
``keras.ops.custom_gradient`` functions; the unrolled mode differentiates the loop itself, through a loop with a static
bound on JAX (whose ``while_loop`` has no reverse-mode gradient; each problem still freezes at its threshold, so the
results are the same). What TensorFlow needs for speed (eager loops compiled into one graph, fused products under XLA)
is in :mod:`ot_layers.backends`.
"""
from typing import NamedTuple

import keras
import numpy as np
from keras import ops

from ot_layers.backends import (DIFFERENTIABLE_WHILE_LOOP, custom_gradient, fused_matvec, fused_small_products,
                                run_solver_loop, values_known)
from ot_layers.tensor_ops import at_least, compute_dtype, dtype_name
from ot_layers.validation import check_choice, check_in_range, check_non_negative, check_positive, check_positive_int

# exp(-x) stays a normal number for x below ~87 in float32 and ~708 in float64; keep a safety margin so that the
# scaled vectors u, v (which grow like exp(+x)) stay finite too.
KERNEL_DOMAIN_LIMIT = {"float32": 30.0, "float64": 300.0}
# log(a_i) stands at this value for a zero-mass entry inside the log-domain loop: exp(LOG_ZERO + ...) is exactly 0 in
# float32 and float64 while every potential stays finite (no -inf arithmetic, no NaN gradient).
LOG_ZERO = -1.0e4
DOMAINS = ("auto", "log", "kernel")
GRADIENTS = ("implicit", "unrolled")
# What ``converged`` measures against when the solver ran a fixed number of updates (``threshold`` 0 or None).
FIXED_ITERATIONS_TOLERANCE = 1e-3


class SinkhornResult(NamedTuple):
    """What :func:`sinkhorn` returns (all in the compute dtype, float32 or float64, except the counts).

    plan: ``(..., n, m)`` transport plan.
    f, g: ``(..., n)``, ``(..., m)`` dual potentials (``T = exp((f + g - C) / eps)``).
    value: ``(...)`` entropic OT value ``<C, T> + eps sum T (log T - 1)``.
    transport_cost: ``(...)`` ``<C, T>``, the plan-weighted cost.
    iterations: ``(...)`` int32, the scaling updates each problem ran (at most ``max_iter``). An update measures the
      error of the potentials it starts from (at no extra cost, from the sums it computes anyway), so a solve stops
      one update after the one that met ``threshold``.
    error: ``(...)`` final row-marginal error ``sum_i |T 1 - a|_i / sum_i a_i`` (columns are met exactly).
    converged: ``(...)`` bool, ``error`` is finite and at most ``threshold`` (at most ``FIXED_ITERATIONS_TOLERANCE``
      when ``threshold`` is 0 or None).

    For zero-mass entries the plan rows / columns are exactly zero and ``f``, ``g`` there hold the soft c-transform
    (see the module docstring).
    """

    plan: object
    f: object
    g: object
    value: object
    transport_cost: object
    iterations: object
    error: object
    converged: object


def _tiny(x):
    return float(np.finfo(dtype_name(x)).tiny)


def _constant_like(x, value):
    return ops.full_like(x, value)


def marginal_error(sums, a):
    """``(...)`` the L1 error ``sum_i |sums_i - a_i|`` of a plan's marginal ``sums`` ``(..., k)`` against the
    weights ``a`` ``(..., k)``, relative to their mass."""
    mass = ops.sum(a, axis=-1)
    return ops.sum(ops.abs(sums - a), axis=-1) / at_least(mass, _tiny(a))


def initial_error(a):
    """``(...)`` errors to start :func:`per_problem_loop` with for variables ``a`` ``(..., k)``: the largest finite
    number, so that the stopping test (which ignores non-finite errors) enters the loop."""
    return _constant_like(a[..., 0], float(np.finfo(dtype_name(a)).max))


def check_overrelaxation(overrelaxation):
    """``overrelaxation`` as a Python float in the open interval ``(0, 2)`` (where over-relaxed Sinkhorn converges
    near its fixed point), else a ``ValueError`` naming it."""
    return float(check_in_range("overrelaxation", overrelaxation, 0.0, 2.0, low_open=True, high_open=True))


def has_converged(error, threshold):
    """Whether each ``error`` is finite and at most ``threshold`` (at most ``FIXED_ITERATIONS_TOLERANCE`` when
    ``threshold`` is 0 or None, a fixed number of updates): the stopping test of :func:`per_problem_loop` and the
    ``converged`` of the solvers' results."""
    tolerance = threshold if threshold else FIXED_ITERATIONS_TOLERANCE
    return ops.logical_and(ops.isfinite(error), error <= tolerance)


def per_problem_loop(body, state, max_iter, threshold, differentiable=False):
    """Runs ``body`` until every problem's marginal error is <= ``threshold`` or ``max_iter`` updates were made.

    ``state`` = (iteration, error, *variables), ``body`` measures the error of the variables it receives, then updates
    them. A problem stops being updated once its own error is <= ``threshold`` (its variables are frozen while the
    others go on), so each problem ends exactly where it would end solved alone: a served model's output for an
    input does not depend on the rest of its batch. A variable that counts updates per problem therefore counts that
    problem's own iterations. ``maximum_iterations`` makes the loop differentiable under XLA.
    A problem whose error is NaN or Inf (NaN/Inf input) never converges; it does not hold the loop for the others, and
    a NaN never decides the test for the batch (``max`` over a batch holding a NaN would be NaN, ``NaN > t`` False).
    ``error`` has the batch shape ``(...)``, every variable one more axis ``(..., k)`` (the mask is broadcast over it).
    With ``differentiable=True`` on a backend that cannot reverse-differentiate a data-dependent loop (JAX), the loop
    runs ``max_iter`` steps with the same per-problem freezing (same results, a static trip count).
    Shared with ``partial_transport`` (GSP's solver), whose scaling stops per problem the same way.
    """
    static = differentiable and not DIFFERENTIABLE_WHILE_LOOP
    if threshold is None or threshold == 0:
        if static:
            return ops.fori_loop(0, max_iter, lambda _, s: tuple(body(*s)), tuple(state))
        return ops.while_loop(lambda i, *_: i < max_iter, body, tuple(state), maximum_iterations=max_iter)

    def cond(i, error, *_):
        pending = ops.logical_and(ops.isfinite(error), error > threshold)
        return ops.logical_and(i < max_iter, ops.any(pending))

    def body_of_pending_problems(i, error, *variables):
        done = has_converged(error, threshold)  # measured on ``variables`` by the previous step: a lone solve would have stopped
        i, new_error, *updated = body(i, error, *variables)
        kept = [ops.where(done[..., None], old, new) for old, new in zip(variables, updated)]
        return (i, ops.where(done, error, new_error), *kept)

    if static:
        return ops.fori_loop(0, max_iter, lambda _, s: tuple(body_of_pending_problems(*s)), tuple(state))
    return ops.while_loop(cond, body_of_pending_problems, tuple(state), maximum_iterations=max_iter)


def _masked_log(x, positive):
    """``log x`` where ``positive``, ``LOG_ZERO`` elsewhere, with a zero (not NaN) gradient at the masked entries."""
    return ops.where(positive, ops.log(ops.where(positive, x, ops.ones_like(x))), _constant_like(x, LOG_ZERO))


def _start(a):
    """The loop state's counters: the loop index, the initial (finite) error and each problem's update count."""
    return ops.convert_to_tensor(0, "int32"), initial_error(a), ops.zeros_like(a[..., :1], dtype="int32")


def _relaxed(old, new, overrelaxation):
    """The over-relaxed update ``(1 - w) old + w new`` of a potential (``new`` itself for ``w = 1``)."""
    if overrelaxation == 1.0:
        return new
    return new + (1.0 - overrelaxation) * (old - new)


def _solve_log(cost, a, b, epsilon, max_iter, threshold, differentiable, overrelaxation=1.0):
    log_a, log_b = _masked_log(a, ops.not_equal(a, 0)), _masked_log(b, ops.not_equal(b, 0))

    def column_update(f):
        return epsilon * (log_b - ops.logsumexp((f[..., :, None] - cost) / epsilon, axis=-2))

    def body(i, error, count, f, g):
        row_lse = ops.logsumexp((g[..., None, :] - cost) / epsilon, axis=-1)
        error = marginal_error(ops.exp(f / epsilon + row_lse), a)
        f = _relaxed(f, epsilon * (log_a - row_lse), overrelaxation)
        g = _relaxed(g, column_update(f), overrelaxation)
        return i + 1, error, count + 1, f, g

    _, _, count, f, g = per_problem_loop(body, (*_start(a), ops.zeros_like(a), ops.zeros_like(b)), max_iter,
                                         threshold, differentiable)
    if overrelaxation != 1.0:  # a last plain column update: the plan's columns are met exactly, as without it
        g = column_update(f)
    return f, g, count[..., 0]


def _batched(equation, matrix):
    """``equation`` over ``matrix``'s batch axes, named by letters when its rank is known (ONNX converters optimize
    only such equations), by an ellipsis otherwise. ``equation`` uses the letters i, j, k only."""
    try:
        rank = len(matrix.shape)
    except ValueError:  # TensorFlow: a shape of unknown rank (an eager loop compiled with relaxed shapes)
        rank = None
    batch = "..." if rank is None else "abcdefgh"[:rank - 2]
    left, output = equation.split("->")
    first, second = left.split(",")
    return f"{batch}{first},{batch}{second}->{batch}{output}"


def _matvec(matrix, vector, transpose=False):
    """``matrix @ vector`` (``matrix^T @ vector`` with ``transpose``) over batches of small matrices, as dots or as
    fused multiply-and-sum where the backend runs those faster (:func:`ot_layers.backends.fused_matvec`)."""
    if fused_matvec(matrix):
        if transpose:
            return ops.sum(matrix * vector[..., :, None], axis=-2)
        return ops.sum(matrix * vector[..., None, :], axis=-1)
    return ops.einsum(_batched("ji,j->i" if transpose else "ij,j->i", matrix), matrix, vector)


def _relaxed_scaling(old, new, marginal, overrelaxation):
    """The over-relaxed update ``old^(1 - w) new^w`` of a scaling vector (``new`` itself for ``w = 1``); entries of
    zero mass stay exactly 0 (where ``old^(1 - w)`` would be ``0^(negative)``)."""
    if overrelaxation == 1.0:
        return new
    positive = ops.not_equal(marginal, 0)
    one = ops.ones_like(old)
    ratio = ops.where(positive, new, one) / ops.where(positive, old, one)
    # exp(w log r): one exp and one log per entry, cheaper than a general power (the ratio is positive here)
    return ops.where(positive, old * ops.exp(overrelaxation * ops.log(ratio)), ops.zeros_like(old))


def _solve_kernel(cost, a, b, epsilon, max_iter, threshold, differentiable, overrelaxation=1.0):
    # Shifting each problem's cost by its minimum leaves the plan unchanged and keeps exp(-C/eps) <= 1.
    shift = ops.min(cost, axis=(-2, -1))
    kernel = ops.exp(-(cost - shift[..., None, None]) / epsilon)

    def column_update(u):
        return b / _matvec(kernel, u, transpose=True)

    def body(i, error, count, u, v):
        kv = _matvec(kernel, v)
        error = marginal_error(u * kv, a)
        u = _relaxed_scaling(u, a / kv, a, overrelaxation)
        v = _relaxed_scaling(v, column_update(u), b, overrelaxation)
        return i + 1, error, count + 1, u, v

    _, _, count, u, v = per_problem_loop(body, (*_start(a), ops.ones_like(a), ops.ones_like(b)), max_iter,
                                         threshold, differentiable)
    if overrelaxation != 1.0:  # a last plain column update: the plan's columns are met exactly, as without it
        v = column_update(u)
    # Zero-mass entries have u_i = 0 (v_j = 0): their potentials are filled in later (_fill_zero_mass).
    f = epsilon * _masked_log(u, ops.not_equal(a, 0)) + shift[..., None]
    g = epsilon * _masked_log(v, ops.not_equal(b, 0))
    return f, g, count[..., 0]


def _solve(cost, a, b, epsilon, max_iter, threshold, domain, differentiable=False, overrelaxation=1.0):
    if domain == "log":
        return _solve_log(cost, a, b, epsilon, max_iter, threshold, differentiable, overrelaxation)
    if domain == "kernel":
        return _solve_kernel(cost, a, b, epsilon, max_iter, threshold, differentiable, overrelaxation)
    spread = ops.max(cost, axis=(-2, -1)) - ops.min(cost, axis=(-2, -1))
    # A NaN problem must not decide the domain of the others (max propagates NaN).
    spread = ops.max(ops.where(ops.isnan(spread), ops.zeros_like(spread), spread))
    safe = spread / epsilon < KERNEL_DOMAIN_LIMIT[dtype_name(cost)]
    return ops.cond(
        safe,
        lambda: _solve_kernel(cost, a, b, epsilon, max_iter, threshold, differentiable, overrelaxation),
        lambda: _solve_log(cost, a, b, epsilon, max_iter, threshold, differentiable, overrelaxation),
    )


def _support(a, b):
    """Entries that carry mass (NaN counts as mass, so that NaN input stays visible), as an ``(..., n, m)`` mask."""
    return ops.logical_and(ops.not_equal(a, 0)[..., :, None], ops.not_equal(b, 0)[..., None, :])


def _plan(cost, f, g, epsilon, support):
    # The masked exponent (not a masked exp) keeps the gradient of the discarded entries at 0 instead of 0 * inf.
    exponent = ops.where(support, (f[..., :, None] + g[..., None, :] - cost) / epsilon,
                         _constant_like(cost, LOG_ZERO))
    return ops.where(support, ops.exp(exponent), ops.zeros_like(cost))


def plan_weighted_cost(plan, cost):
    """``<C, T>`` per problem, where ``+inf`` costs (forbidden pairs, whose plan entries are exactly 0) count 0 rather
    than ``0 * inf = NaN``; the gradient there is 0 for ``cost`` and for ``plan``."""
    finite_cost = ops.where(ops.logical_and(ops.isinf(cost), cost > 0), ops.zeros_like(cost), cost)
    return ops.sum(plan * finite_cost, axis=(-2, -1))


def _count_like(x, axis):
    """The size of ``x`` along ``axis`` as a tensor of ``x``'s dtype broadcast over the other axes (known or not)."""
    return ops.sum(ops.ones_like(x), axis=axis, keepdims=True)


def _safe_marginals(a, b):
    """Problems with no mass at all are solved with uniform marginals (their plan is masked to zero afterwards), and
    zero entries are constants (a zero gradient there, in the kernel domain's unrolled loop too)."""
    a = ops.where(ops.equal(a, 0), ops.stop_gradient(a), a)
    b = ops.where(ops.equal(b, 0), ops.stop_gradient(b), b)
    empty = ops.equal(ops.sum(ops.abs(a), axis=-1), 0)[..., None]
    uniform_a = ops.ones_like(a) / _count_like(a, -1)
    uniform_b = ops.ones_like(b) / _count_like(b, -1)
    return ops.where(empty, uniform_a, a), ops.where(empty, uniform_b, b), empty


def _fill_zero_mass(cost, f, g, a, b, epsilon, empty):
    """Soft c-transforms at zero-mass entries (finite, and what the potential would be with unit mass); zeros for
    problems without mass."""
    zero_a, zero_b = ops.equal(a, 0), ops.equal(b, 0)
    log_mask_b = ops.where(zero_b, _constant_like(b, LOG_ZERO), ops.zeros_like(b))
    g_support = ops.where(zero_b, ops.zeros_like(g), g)
    f_c = -epsilon * ops.logsumexp((g_support[..., None, :] - cost) / epsilon + log_mask_b[..., None, :], axis=-1)
    f = ops.where(zero_a, f_c, f)
    log_mask_a = ops.where(zero_a, _constant_like(a, LOG_ZERO), ops.zeros_like(a))
    f_support = ops.where(zero_a, ops.zeros_like(f), f)
    g_c = -epsilon * ops.logsumexp((f_support[..., :, None] - cost) / epsilon + log_mask_a[..., :, None], axis=-2)
    g = ops.where(zero_b, g_c, g)
    return ops.where(empty, ops.zeros_like(f), f), ops.where(empty, ops.zeros_like(g), g)


def _entropic_value(plan, f, g, epsilon):
    # <C,T> + eps sum T (log T - 1) with log T = (f + g - C) / eps.
    return ops.sum(plan * (f[..., :, None] + g[..., None, :] - epsilon), axis=(-2, -1))


def _centred(x, positive):
    """``x`` minus its mean over the ``positive`` entries, and 0 at the others (zero-mass entries)."""
    count = ops.sum(ops.cast(positive, dtype_name(x)), axis=-1, keepdims=True)
    mean = ops.sum(ops.where(positive, x, ops.zeros_like(x)), axis=-1, keepdims=True) / at_least(count, 1.0)
    return ops.where(positive, x - mean, ops.zeros_like(x))


# Up to this size the Schur complement is solved by an unrolled Cholesky where small products are fused (XLA on CPU):
# there a batch of tiny systems solves about ten times slower than elementwise work, which fuses well.
UNROLLED_SOLVE_MAX_SIZE = 8


def _unrolled_cholesky_solve(matrix, rhs):
    """Solves ``matrix x = rhs`` for a batch of small symmetric positive definite ``matrix`` ``(..., m, m)`` with a
    static ``m``, as elementwise operations on the batch (Cholesky, then forward and back substitution)."""
    m = matrix.shape[-1]
    tiny = _tiny(matrix)
    a = [[matrix[..., i, j] for j in range(m)] for i in range(m)]
    lower = [[None] * m for _ in range(m)]
    for j in range(m):
        diagonal = a[j][j] - sum((lower[j][k] ** 2 for k in range(j)), ops.zeros_like(a[j][j]))
        lower[j][j] = ops.sqrt(at_least(diagonal, tiny))
        for i in range(j + 1, m):
            off = a[i][j] - sum((lower[i][k] * lower[j][k] for k in range(j)), ops.zeros_like(a[i][j]))
            lower[i][j] = off / lower[j][j]
    z = []
    for i in range(m):
        z.append((rhs[..., i] - sum((lower[i][k] * z[k] for k in range(i)), ops.zeros_like(rhs[..., i])))
                 / lower[i][i])
    x = [None] * m
    for i in reversed(range(m)):
        x[i] = (z[i] - sum((lower[k][i] * x[k] for k in range(i + 1, m)), ops.zeros_like(z[i]))) / lower[i][i]
    return ops.stack(x, axis=-1)


def _identity_like(matrix):
    """Identity matrices with ``matrix``'s (possibly unknown) batch shape and size."""
    index = ops.cumsum(ops.ones_like(matrix[..., 0, :]), axis=-1)  # (..., m) = 1..m
    return ops.cast(ops.equal(index[..., :, None], index[..., None, :]), dtype_name(matrix))


def _spd_solve(matrix, rhs):
    m = matrix.shape[-1]
    if fused_small_products(matrix) and m is not None and m <= UNROLLED_SOLVE_MAX_SIZE:
        return _unrolled_cholesky_solve(matrix, rhs)
    # A batched solver may raise (TensorFlow) or spread NaN for a batch holding one non-finite matrix: solve an
    # identity there instead and give that problem NaN, so NaN input stays in its own problem.
    bad = ops.logical_not(ops.all(ops.isfinite(matrix), axis=(-2, -1)))
    eye = _identity_like(matrix)
    solution = ops.squeeze(ops.solve(ops.where(bad[..., None, None], eye, matrix), rhs[..., None]), axis=-1)
    return ops.where(bad[..., None], _constant_like(solution, float("nan")), solution)


def _adjoint(plan, upstream):
    """Solves ``H [x; y] = [(G*T) 1; (G*T)^T 1]`` through the Schur complement on the column side.

    ``H = [[diag(r), T], [T^T, diag(c)]]`` with ``r, c`` the plan's own marginals; ``H`` is singular along
    ``(1, -1)``, which ``+ 1 1^T`` on the Schur complement ``diag(c) - T^T diag(1/r) T`` removes (the right-hand
    side is orthogonal to it).
    """
    weighted = upstream * plan
    rhs_rows = ops.sum(weighted, axis=-1)
    rhs_cols = ops.sum(weighted, axis=-2)
    rows = at_least(ops.sum(plan, axis=-1), _tiny(plan))
    cols = ops.sum(plan, axis=-2)
    scaled = plan / rows[..., :, None]
    if fused_small_products(plan):
        gram = ops.sum(plan[..., :, :, None] * scaled[..., :, None, :], axis=-3)
    else:
        gram = ops.einsum(_batched("ki,kj->ij", plan), plan, scaled)
    scale = ops.mean(cols, axis=-1, keepdims=True)
    scale = ops.where(scale > 0, scale, ops.ones_like(scale))
    # An empty column (zero mass, or all entries underflowed) has a zero row and column in the Schur complement; a
    # diagonal entry of the mean column mass there decouples it (its right-hand side is 0, so y_j = 0 exactly),
    # leaving the reduced problem's system.
    eye = _identity_like(gram)
    schur = eye * ops.where(cols > 0, cols, scale)[..., None, :] - gram
    scale = scale[..., None]
    # + 1 1^T removes the gauge direction; a ridge of a few ulps keeps the solve finite when underflowed plan
    # entries split the problem into disconnected blocks (tiny epsilon, float32), each adding a null direction.
    ridge = 10.0 * float(np.finfo(dtype_name(plan)).eps)
    schur = schur + scale * (ops.ones_like(schur) + ridge * eye)
    y = _spd_solve(schur, rhs_cols - _matvec(scaled, rhs_rows, transpose=True))
    x = (rhs_rows - _matvec(plan, y)) / rows
    return x, y


def _implicit_plan(cost, a, b, f, g, epsilon):
    """The plan from converged potentials ``f``, ``g`` (constants), with its fixed-point (implicit) gradient."""

    @custom_gradient
    def plan_of(cost, a, b, f, g):
        plan = _plan(cost, f, g, epsilon, _support(a, b))

        def grad(d_plan):
            n, m = plan.shape[-2], plan.shape[-1]
            if n is not None and m is not None and n < m:  # the Schur complement on the smaller side
                y, x = _adjoint(ops.swapaxes(plan, -1, -2), ops.swapaxes(d_plan, -1, -2))
            else:
                x, y = _adjoint(plan, d_plan)
            d_cost = plan * (x[..., :, None] + y[..., None, :] - d_plan) / epsilon
            return (d_cost, _centred(x, ops.not_equal(a, 0)), _centred(y, ops.not_equal(b, 0)),
                    ops.zeros_like(f), ops.zeros_like(g))

        return plan, grad

    return plan_of(cost, a, b, f, g)


def _danskin_value(cost, a, b, f, g, epsilon):
    """The entropic value from converged potentials, with Danskin's gradients ``T``, ``f``, ``g``."""

    @custom_gradient
    def value_of(cost, a, b, f, g):
        plan = _plan(cost, f, g, epsilon, _support(a, b))
        value = _entropic_value(plan, f, g, epsilon)

        def grad(d_value):
            dv = d_value[..., None]
            return (dv[..., None] * plan, _centred(dv * f, ops.not_equal(a, 0)), _centred(dv * g, ops.not_equal(b, 0)),
                    ops.zeros_like(f), ops.zeros_like(g))

        return value, grad

    return value_of(cost, a, b, f, g)


# The machine epsilon of the low-precision float types: the relative gap between two sums of non-negative weights
# that rounding each weight to that type can cause is at most this.
LOW_PRECISION_EPSILON = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}


def _broadcast_batch(first, second):
    """The batch shape two statically known batch shapes broadcast to (``None``: a size known only at run time),
    or ``None`` when two known sizes clash."""
    rank = max(len(first), len(second))
    first, second = (1,) * (rank - len(first)) + tuple(first), (1,) * (rank - len(second)) + tuple(second)
    shape = []
    for x, y in zip(first, second):
        if x == 1 or x == y:
            shape.append(y)
        elif y == 1:
            shape.append(x)
        elif x is None or y is None:  # the known size (or a clash the backend reports at run time)
            shape.append(y if x is None else x)
        else:
            return None
    return tuple(shape)


def _validate_marginal(name, marginal, expected_shape, batch_shape, owners):
    """Checks the static shape of marginal ``name`` against the ``expected_shape`` entries and the ``batch_shape``
    of ``owners`` (the arguments it must broadcast with, in words); returns the batch shape they broadcast to."""
    if len(marginal.shape) < 1:
        raise ValueError(f"`{name}` must have at least one dimension, got shape {tuple(marginal.shape)}.")
    lead, batch = tuple(marginal.shape[:-1]), tuple(batch_shape)
    common = _broadcast_batch(lead, batch)
    if common is None:  # statically known dims only; the backend's own error would name no argument
        raise ValueError(f"`{name}` has batch shape {lead}, which does not broadcast to the batch shape {batch} of "
                         f"{owners}.")
    if expected_shape is not None and marginal.shape[-1] is not None and marginal.shape[-1] != expected_shape:
        raise ValueError(
            f"`{name}` has {marginal.shape[-1]} entries per problem but `cost` has {expected_shape} on that side."
        )
    return common


def _host_marginal(marginal, size, dtype):
    """The values of a marginal (``None``: the uniform one of ``size`` entries) as a NumPy array in ``dtype``, or
    ``None`` when Python may not read them (:func:`ot_layers.backends.values_known`: while tracing). Value checks
    run on these host copies, never on backend operations: on JAX a concrete array closed over by a ``jit``-ed
    function can be read, but any operation on it there is traced."""
    if marginal is None:
        return None if size is None else np.full(size, 1.0 / size, dtype)
    if not values_known(marginal):
        return None
    return np.asarray(ops.convert_to_numpy(marginal)).astype(dtype)


def _check_masses(a, b, low_precision):
    """Host marginals ``a`` ``(..., n)`` and ``b`` ``(..., m)``: raises unless their sums are equal per problem.

    A problem whose marginals are all zero has equal (zero) masses; a problem whose sums are not finite (NaN or Inf
    weights) is not compared, so that it stays in its own problem without disabling the check of the others."""
    sums_a, sums_b = a.sum(axis=-1), b.sum(axis=-1)
    scale = np.maximum(sums_a, sums_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        gaps = np.where(scale == 0, 0.0, np.abs(sums_a - sums_b) / scale)
    gaps = gaps[np.isfinite(gaps)]
    gap = float(gaps.max()) if gaps.size else 0.0  # an empty batch has no problem to compare
    if gap > 1e-5:
        rounding = max((LOW_PRECISION_EPSILON[name] for name in low_precision), default=0.0)
        hint = (f"; {' and '.join(low_precision)} marginals round most weights (1/3, say), so their sums "
                "differ: pass them in float32" if gap <= rounding else "")
        raise ValueError(f"`a` and `b` must have equal sums per problem (relative gap {gap:.3g}){hint}.")


def _fits(shape, batch):
    """Whether a tensor of batch shape ``shape`` broadcasts to the batch shape ``batch`` without growing it (a size
    known only at run time is taken to match one at the same place)."""
    shape, batch = tuple(shape), tuple(batch)
    return len(shape) <= len(batch) and all(x == 1 or x == y for x, y in zip(reversed(shape), reversed(batch)))


def _broadcast_problems(cost, a, b):
    """``cost`` ``(..., n, m)``, ``a`` ``(..., n)`` and ``b`` ``(..., m)`` broadcast to their common batch shape, by
    adding zeros (which works for sizes known only at run time too): the cost where a marginal's batch shape is not
    within its own, a marginal unless its batch shape is statically that of the cost."""
    if not _fits(a.shape[:-1], cost.shape[:-2]):
        cost = cost + ops.zeros_like(a[..., :, None])
    if not _fits(b.shape[:-1], cost.shape[:-2]):
        cost = cost + ops.zeros_like(b[..., None, :])
    batch = tuple(cost.shape[:-2])
    if None in batch or tuple(a.shape[:-1]) != batch:
        a = a + ops.zeros_like(cost[..., :, 0])
    if None in batch or tuple(b.shape[:-1]) != batch:
        b = b + ops.zeros_like(cost[..., 0, :])
    return cost, a, b


def _real_tensor(name, value):
    """``value`` as a backend tensor; strings, objects and complex numbers are refused naming ``name`` (a string was
    refused by the cast in words naming no argument, a complex number lost its imaginary part). Host arrays are
    judged by their NumPy dtype before conversion; tensors and Keras variables are converted as they are, so that
    their gradients and tracing are kept."""
    if isinstance(value, (np.ndarray, np.generic, str, bytes)):
        host_dtype = np.asarray(value).dtype
        if host_dtype.kind in "USOc":
            raise ValueError(f"`{name}` must hold real numbers, got dtype {host_dtype}.")
    tensor = ops.convert_to_tensor(value)
    dtype = keras.backend.standardize_dtype(tensor.dtype)
    if dtype.startswith(("complex", "string")):
        raise ValueError(f"`{name}` must hold real numbers, got dtype {dtype}.")
    return tensor


def _uniform(cost, axis):
    """Uniform marginals ``(..., size)`` for the rows (``axis=-2``) or columns (``axis=-1``) of ``cost``."""
    ones = ops.ones_like(cost[..., :, 0] if axis == -2 else cost[..., 0, :])
    return ones / _count_like(ones, -1)


def prepare_problem(cost, a=None, b=None):
    """Validates a batch of transport problems and returns ``(cost, a, b)`` in the compute dtype.

    ``cost`` ``(..., n, m)``; marginals default to uniform, must be non-negative with equal sums per problem
    (checked on host copies of the values where Python may read them, :func:`ot_layers.backends.values_known`:
    eagerly, and on JAX for concrete arrays closed over by a ``jit``-ed function; not for traced values). A problem
    whose marginals are all zero has equal (zero) sums; one whose sums are NaN or Inf is not compared (the NaN or
    Inf stays in its own problem, see the module docstring), and neither disables the check of the other problems.
    Cost and marginals must hold real numbers (not strings or complex numbers); the cost and the marginals are
    broadcast to their common batch shape (one cost shared by a batch of marginals is solved once per pair of
    marginals; batch shapes ``(2, 1)`` and ``(3,)`` give ``(2, 3)`` problems).
    """
    cost = _real_tensor("cost", cost)
    dtype = compute_dtype(cost.dtype)
    cost = ops.cast(cost, dtype)
    if len(cost.shape) < 2:
        raise ValueError(f"`cost` must have shape (..., n, m) with rank >= 2, got shape {tuple(cost.shape)}.")
    if 0 in tuple(cost.shape[-2:]):
        raise ValueError(f"`cost` must have n >= 1 rows and m >= 1 columns, got shape {tuple(cost.shape)}.")
    a = None if a is None else _real_tensor("a", a)
    b = None if b is None else _real_tensor("b", b)
    # the marginals' own dtypes, for the hint of a failed mass check below
    low_precision = sorted({keras.backend.standardize_dtype(x.dtype) for x in (a, b) if x is not None}
                           & set(LOW_PRECISION_EPSILON))
    n, m = cost.shape[-2], cost.shape[-1]
    batch = tuple(cost.shape[:-2])
    if a is not None:
        batch = _validate_marginal("a", a, n, batch, "`cost`")
    if b is not None:
        batch = _validate_marginal("b", b, m, batch, "`cost`" if a is None else "`cost` and `a`")
    host_a = _host_marginal(a, n, dtype)
    host_b = _host_marginal(b, m, dtype)
    for name, host in (("a", host_a), ("b", host_b)):
        if host is not None and bool(np.any(host < 0)):
            raise ValueError(f"`{name}` must be non-negative.")
    if host_a is not None and host_b is not None and (a is not None or b is not None):
        _check_masses(host_a, host_b, low_precision)
    a = _uniform(cost, -2) if a is None else ops.cast(a, dtype)
    b = _uniform(cost, -1) if b is None else ops.cast(b, dtype)
    return _broadcast_problems(cost, a, b)


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
    overrelaxation=1.0,
):
    """Batched entropic OT between the rows and columns of ``cost`` (Cuturi 2013), on any Keras backend.

    Args:
      cost: ``(..., n, m)`` cost matrices; any leading dimensions are a batch.
      a, b: marginals ``(..., n)`` and ``(..., m)``; uniform ``1/n``, ``1/m`` when ``None``. Non-negative, with
        equal sums per problem; zero entries are allowed (their plan rows / columns are zero, see the module
        docstring). ``cost``, ``a`` and ``b`` are broadcast to their common batch shape (``cost`` ``(n, m)`` with
        ``a`` ``(2, 1, n)`` and ``b`` ``(3, m)``: ``(2, 3)`` problems).
      epsilon: entropic regularization ``> 0``.
      max_iter: hard bound on the scaling updates (also the ``maximum_iterations`` XLA needs).
      threshold: stop once every problem's row-marginal error ``sum |T 1 - a| / sum a`` is at most this; ``0`` or
        ``None`` runs exactly ``max_iter`` updates.
      domain: ``"log"``, ``"kernel"``, or ``"auto"`` (kernel while ``(max C - min C) / eps`` is below
        ``KERNEL_DOMAIN_LIMIT`` for the compute dtype, log otherwise). With ``gradient="unrolled"``, ``"auto"``
        means ``"log"``: autodiff through a data-dependent branch around the loop does not compile under XLA.
      gradient: ``"implicit"`` (fixed-point differentiation, constant memory) or ``"unrolled"`` (autodiff through
        the iterations; on JAX a loop of ``max_iter`` steps in which converged problems stay frozen).
      overrelaxation: the factor ``w`` in ``(0, 2)`` of over-relaxed updates (Thibault et al. 2021; Lehmann et al.
        2022): each potential moves to ``(1 - w) old + w new`` (each scaling vector to ``old^(1 - w) new^w``), then
        one plain column update ends the solve, so the columns are met exactly as with ``w = 1``, plain Sinkhorn.
        The fixed point, hence the plan and the implicit gradient, are those of plain Sinkhorn; ``w > 1`` can need
        several times fewer updates where plain Sinkhorn is slow (small ``epsilon``) and more where it is fast, and
        too large a ``w`` oscillates or diverges (``benchmarks/emd.py`` measures it). ``error`` and ``converged``
        describe the plan returned: that last update moves the rows a little, so a problem whose loop met
        ``threshold`` may end just above it.

    Returns:
      :class:`SinkhornResult`, computed in float32 (float64 for float64 input) whatever the input dtype.
    """
    check_positive("epsilon", epsilon)
    max_iter = check_positive_int("max_iter", max_iter)
    if threshold is not None:
        check_non_negative("threshold", threshold)
    check_choice("domain", domain, DOMAINS)
    check_choice("gradient", gradient, GRADIENTS)
    overrelaxation = check_overrelaxation(overrelaxation)

    cost, a, b = prepare_problem(cost, a, b)
    scale = float(epsilon)  # a Python number where a custom gradient closes over it (JAX traces no closed tensors)
    epsilon = ops.convert_to_tensor(scale, dtype_name(cost))
    a_solve, b_solve, empty = _safe_marginals(a, b)

    if gradient == "implicit":
        fixed = [ops.stop_gradient(x) for x in (cost, a_solve, b_solve)]
        f, g, iterations = run_solver_loop(_solve, *fixed, epsilon, max_iter, threshold, domain, False,
                                           overrelaxation)
        f, g = _fill_zero_mass(fixed[0], f, g, a, b, epsilon, empty)
        f, g = ops.stop_gradient(f), ops.stop_gradient(g)
        plan = _implicit_plan(cost, a, b, f, g, scale)
        value = _danskin_value(cost, a, b, f, g, scale)
    else:
        domain = "log" if domain == "auto" else domain
        f, g, iterations = run_solver_loop(_solve, cost, a_solve, b_solve, epsilon, max_iter, threshold, domain,
                                           True, overrelaxation)
        f, g = _fill_zero_mass(cost, f, g, a, b, epsilon, empty)
        plan = _plan(cost, f, g, epsilon, _support(a, b))
        value = _entropic_value(plan, f, g, epsilon)
    transport_cost = plan_weighted_cost(plan, cost)
    error = marginal_error(ops.sum(plan, axis=-1), a)
    return SinkhornResult(plan, f, g, value, transport_cost, iterations, error, has_converged(error, threshold))
