"""Batched Earth Mover's Distance, exact or entropic, with gradients (Zhang et al. 2022 Eq. 1).

For every leading index of ``cost`` ``(..., n, m)`` solves the transportation linear program (Zhang et al. 2022, Eq.
1)::

    W(C, a, b) = min_T <C, T>   s.t.  T 1 = a,  T^T 1 = b,  T >= 0

- ``method="exact"``: POT's network simplex (its C++ core, ``ot.lp.emd_wrap.emd_c``) on each problem on the host,
  in float64, through :func:`ot_layers.backends.host_call`: ``tf.numpy_function`` on TensorFlow (not XLA-compilable
  and not exportable: a Python function in the graph), ``jax.pure_callback`` on JAX (inside ``jax.jit`` too), NumPy
  on detached CPU arrays on PyTorch. Gradients by Danskin's theorem (the LP value is a min over a polytope that
  depends on ``a``, ``b`` only through the constraints), given by :func:`ot_layers.backends.custom_gradient` on every
  backend: ``dW/dC = T*`` (the optimal flow), ``dW/da = u - mean(u)``, ``dW/db = v - mean(v)`` with ``(u, v)`` the
  optimal dual potentials (``u_i + v_j <= C_ij``, ``W = a.u + b.v``). The duals are centred because only
  mass-preserving changes of the weights are defined. The optimal plan and the duals are piecewise constant in the
  inputs; they are returned without a gradient. The host computes in float64 and the results come back in the
  compute dtype (float32, or float64 for float64 input). NaN/Inf costs or weights raise an error naming the argument
  and the problem: ``ValueError`` when the values are known (eager TensorFlow, PyTorch, JAX outside ``jit``); from
  inside a graph the host's ``ValueError`` surfaces as TensorFlow's ``InvalidArgumentError`` (JAX: the callback's
  error).
- ``method="sinkhorn"``: :func:`ot_layers.solvers.sinkhorn` at a small ``epsilon``; ``cost`` is then the
  plan-weighted cost ``<C, T_eps>`` (not the entropic objective), which approaches ``W`` as ``epsilon -> 0``. Pure
  ``keras.ops`` (TensorFlow, JAX, PyTorch): batched, XLA-compilable, exportable from TensorFlow, with the Sinkhorn
  solver's implicit gradients, its zero-mass handling and its NaN confinement (a NaN problem gives NaN, the others
  are unaffected).
"""
import contextlib
import os
from typing import NamedTuple
import warnings

import keras
import numpy as np
from keras import ops


@contextlib.contextmanager
def _pot_without_tensorflow():
    """While POT is imported on JAX or PyTorch: its TensorFlow backend switched off (``POT_BACKEND_DISABLE_TENSORFLOW``,
    read once, when POT's backends load), so that ``import ot_layers`` there does not load TensorFlow beside the
    active framework (POT imports every framework installed; the network simplex needs only its NumPy core). The
    variable is restored afterwards; a POT imported before is used as it is."""
    key = "POT_BACKEND_DISABLE_TENSORFLOW"
    if keras.backend.backend() == "tensorflow" or key in os.environ:
        yield
        return
    os.environ[key] = "1"
    try:
        yield
    finally:
        del os.environ[key]


with _pot_without_tensorflow():
    from ot.lp.emd_wrap import check_result, emd_c

from ot_layers.backends import custom_gradient, host_call, values_known  # noqa: E402
from ot_layers.solvers.sinkhorn import (DOMAINS, check_overrelaxation, marginal_error, prepare_problem,  # noqa: E402
                                      sinkhorn)
from ot_layers.tensor_ops import at_least  # noqa: E402
from ot_layers.validation import check_choice, check_non_negative, check_positive, check_positive_int  # noqa: E402

METHODS = ("exact", "sinkhorn")
# Sinkhorn defaults for EMD, chosen for the plan-weighted cost to stay within 2 % of the exact value on 25x25
# cosine-cost problems (measured in tests/test_emd_solver.py and benchmarks/emd.py; epsilon = 0.07 deviates by
# ~8 %, 0.05 by ~4.5 %, 0.03 by ~1.9 %).
SINKHORN_EPSILON = 0.03
SINKHORN_MAX_ITER = 100
SINKHORN_THRESHOLD = 1e-3
# Cosine costs lie in [0, 2]. For a cost spread of at most 2 the kernel exp(-(C - min C) / eps) stays a normal
# float32 number (> 1e-38) while 2 / eps <= 70, and the scalings stay finite: EMDHead then runs the Sinkhorn solver in
# its kernel domain (matrix-vector products) instead of the log domain its generic bound (30) would pick.
COSINE_KERNEL_LIMIT = 70.0
# The settings only the entropic method uses, with their defaults: the exact method ignores them (and warns when one
# is given another value, see :func:`warn_of_ignored_sinkhorn_settings`).
SINKHORN_DEFAULTS = {"epsilon": SINKHORN_EPSILON, "max_iter": SINKHORN_MAX_ITER, "threshold": SINKHORN_THRESHOLD,
                     "domain": "auto", "overrelaxation": 1.0}
# The network simplex's iteration bound (POT's default).
SIMPLEX_MAX_ITER = 100000
# ``iterations`` of an exact solve: POT's network simplex does not report how many pivots it made.
NOT_COUNTED = -1


class EMDResult(NamedTuple):
    """What :func:`emd` returns (float32, or float64 for float64 input).

    plan: ``(..., n, m)`` the optimal flow (exact) or the entropic plan.
    cost: ``(...)`` ``<C, T>``, the EMD value (exact) or its entropic approximation.
    f, g: ``(..., n)``, ``(..., m)`` centred dual potentials (exact) or the Sinkhorn potentials.
    iterations: ``(...)`` int32; Sinkhorn: the scaling updates each problem ran (as
      :class:`~ot_layers.solvers.SinkhornResult`); exact: ``NOT_COUNTED`` (-1), the network simplex does not report
      its pivots.
    error: ``(...)`` marginal error of the returned plan relative to the mass
      (:func:`~ot_layers.solvers.sinkhorn.marginal_error`); Sinkhorn: its row error ``sum_i |T 1 - a|_i / sum_i a_i``
      (columns are met exactly); exact: the larger of the row and column errors (round-off in the compute dtype,
      plus the columns' rescaling onto ``a``'s mass when the sums differ within validation).
    converged: ``(...)`` bool; Sinkhorn: ``error`` finite and at most ``threshold``; exact: the network simplex
      reported an optimal flow (not its iteration bound, not an infeasible or unbounded problem). A simplex stopped
      at its bound returns a flow that still routes mass through its artificial arcs: it misses the marginals (a
      large ``error``) and its cost may undercut the optimum.

    The first four fields come first, so ``result[:2]`` is ``(plan, cost)`` for either method.
    """

    plan: object
    cost: object
    f: object
    g: object
    iterations: object
    error: object
    converged: object


def _check_finite(cost, a, b):
    """Raises ``ValueError`` naming the first non-finite argument and problem (NumPy arrays ``(P, ...)``)."""
    for name, array in (("cost", cost), ("a", a), ("b", b)):
        if array.shape[0] == 0:  # an empty batch: no problem to check
            continue
        bad = ~np.isfinite(array.reshape(array.shape[0], -1)).all(axis=1)
        if bad.any():
            raise ValueError(f"`{name}` of the exact EMD must be finite; problem {int(np.argmax(bad))} (of "
                             f"{array.shape[0]}) holds NaN or Inf (NaN/Inf features?).")


def _network_simplex(cost, a, b):
    """NumPy: optimal flows, values, centred duals and optimality flags of ``P`` problems.

    ``cost (P, n, m)``, ``a (P, n)``, ``b (P, m)``, all float64. A problem whose weights are all zero has a zero
    flow, value and duals (optimal: there is nothing to move).
    """
    _check_finite(cost, a, b)
    plans = np.empty_like(cost)
    values = np.empty(cost.shape[0], dtype=cost.dtype)
    f = np.empty_like(a)
    g = np.empty_like(b)
    optimal = np.empty(cost.shape[0], dtype=bool)
    for p in range(cost.shape[0]):
        mass_a, mass_b = a[p].sum(), b[p].sum()
        if mass_a == 0 and mass_b == 0:  # no mass to move (the simplex would call it infeasible)
            plans[p], values[p], f[p], g[p], optimal[p] = 0.0, 0.0, 0.0, 0.0, True
            continue
        # The simplex needs equal masses to round-off; rescale b onto a's sum (they agree within validation).
        b_p = b[p] * (mass_a / mass_b) if mass_b > 0 else b[p]
        plan, value, u, v, code = emd_c(a[p], b_p, np.ascontiguousarray(cost[p]), SIMPLEX_MAX_ITER, 1)
        with warnings.catch_warnings():  # POT's own warning would repeat the message without the problem's index
            warnings.simplefilter("ignore")
            message = check_result(code)
        if message:
            warnings.warn(f"Exact EMD, problem {p}: {message}", RuntimeWarning, stacklevel=2)
        plans[p], values[p], optimal[p] = plan, value, not message
        f[p], g[p] = u - u.mean(), v - v.mean()
    return plans, values, f, g, optimal


def _host_network_simplex(cost, a, b):
    """:func:`_network_simplex` on arrays in the compute dtype: the host computes in float64 and answers in the
    dtype it was given (float32, or float64 for float64 input); the optimality flags stay bool."""
    dtype = cost.dtype
    *results, optimal = _network_simplex(*(np.asarray(x, dtype=np.float64) for x in (cost, a, b)))
    return (*(r.astype(dtype) for r in results), optimal)


def _danskin_value(cost, a, b, value, plan, f, g):
    """The EMD ``value`` (computed on the host) as a function of ``cost``, ``a``, ``b`` with Danskin's gradients
    ``dW/dC = T*``, ``dW/da = f``, ``dW/db = g`` (centred duals); ``value``, ``plan``, ``f``, ``g`` are constants."""

    @custom_gradient
    def value_of(cost, a, b, value, plan, f, g):
        def grad(d_value):
            return (d_value[..., None, None] * plan, d_value[..., None] * f, d_value[..., None] * g,
                    ops.zeros_like(value), ops.zeros_like(plan), ops.zeros_like(f), ops.zeros_like(g))

        return value, grad

    return value_of(cost, a, b, value, plan, f, g)


def _exact(cost, a, b):
    """Exact EMD of a batch ``(..., n, m)`` through the network simplex on the host
    (:func:`ot_layers.backends.host_call`), with Danskin gradients for the value; plan and duals are constants
    (piecewise constant in the inputs)."""
    dtype = keras.backend.standardize_dtype(cost.dtype)
    shape = ops.shape(cost)
    n, m = shape[-2], shape[-1]
    flat_cost = ops.reshape(ops.stop_gradient(cost), (-1, n, m))
    flat_a = ops.reshape(ops.stop_gradient(a), (-1, n))
    flat_b = ops.reshape(ops.stop_gradient(b), (-1, m))
    problems = tuple(flat_cost.shape)[:1]
    outputs = [(tuple(flat_cost.shape), dtype), (problems, dtype), (tuple(flat_a.shape), dtype),
               (tuple(flat_b.shape), dtype), (problems, "bool")]
    plan, value, f, g, optimal = host_call(_host_network_simplex, [flat_cost, flat_a, flat_b], outputs)
    plan = ops.stop_gradient(ops.reshape(plan, shape))
    value = ops.stop_gradient(ops.reshape(value, shape[:-2]))
    f = ops.stop_gradient(ops.reshape(f, ops.shape(a)))
    g = ops.stop_gradient(ops.reshape(g, ops.shape(b)))
    error = ops.stop_gradient(at_least(marginal_error(ops.sum(plan, axis=-1), a),  # not ops.maximum: float32 on torch
                                       marginal_error(ops.sum(plan, axis=-2), b)))
    converged = ops.reshape(optimal, shape[:-2])
    iterations = ops.full_like(error, NOT_COUNTED, dtype="int32")
    return EMDResult(plan, _danskin_value(cost, a, b, value, plan, f, g), f, g, iterations, error, converged)


def _differs(value, default):
    """Whether a setting's ``value`` is not its ``default`` (numbers compared as numbers: ``numpy.float32(0.03)``
    is the default 0.03)."""
    if isinstance(default, str) or value is None or isinstance(value, str):
        return value != default
    try:
        return not np.isclose(float(value), float(default), rtol=1e-6, atol=0.0)
    except (TypeError, ValueError):
        return True


def warn_of_ignored_sinkhorn_settings(caller, stacklevel=2, **settings):
    """A ``UserWarning`` naming the Sinkhorn ``settings`` (of :data:`SINKHORN_DEFAULTS`) given values other than their
    defaults to ``caller`` (e.g. ``"EMDHead"``) with ``method="exact"``, which ignores them: a solve the user meant
    to be entropic (``epsilon=0.05``, say) would otherwise run the network simplex without a word. ``stacklevel``
    as :func:`warnings.warn`'s, counted from the caller of this function."""
    changed = [f"{name}={value!r}" for name, value in settings.items() if _differs(value, SINKHORN_DEFAULTS[name])]
    if changed:
        warnings.warn(f'{caller}(method="exact") ignores {", ".join(changed)}: these are the Sinkhorn settings of '
                      'method="sinkhorn"; pass method="sinkhorn" to use them, or leave them out.', UserWarning,
                      stacklevel=stacklevel + 1)


def emd(cost, a=None, b=None, *, method="exact", epsilon=SINKHORN_EPSILON, max_iter=SINKHORN_MAX_ITER,
        threshold=SINKHORN_THRESHOLD, domain="auto", overrelaxation=1.0):
    """Batched EMD ``min_T <C, T>`` s.t. ``T 1 = a``, ``T^T 1 = b`` (Zhang et al. 2022, Eq. 1), exact or entropic.

    Args:
      cost: ``(..., n, m)`` cost matrices; leading dimensions are a batch of independent problems.
      a, b: node weights ``(..., n)``, ``(..., m)``, non-negative with equal sums per problem (checked where the
        values are known, see :func:`ot_layers.solvers.sinkhorn.prepare_problem`); uniform ``1/n``, ``1/m`` when
        ``None``. ``cost``, ``a`` and ``b`` are broadcast to their common batch shape (``cost`` ``(n, m)`` with
        ``a`` ``(2, 1, n)`` and ``b`` ``(3, m)``: ``(2, 3)`` problems). With ``method="exact"`` zero weights give
        valid flows but their dual entries (gradients) are not meaningful, and a problem whose weights are all zero
        has a zero plan, cost and duals; with ``method="sinkhorn"`` they follow :func:`ot_layers.solvers.sinkhorn`
        (zero plan rows, gradient 0 there).
      method: ``"exact"`` (network simplex on the host, Danskin gradients, not exportable) or ``"sinkhorn"``
        (entropic, ``keras.ops``; exportable).
      epsilon, max_iter, threshold, domain, overrelaxation: the Sinkhorn settings (``method="sinkhorn"`` only, see
        :func:`ot_layers.solvers.sinkhorn`; ``method="exact"`` ignores them, with a ``UserWarning`` naming those
        given values other than their defaults).

    Returns:
      :class:`EMDResult` ``(plan, cost, f, g, iterations, error, converged)``.
    """
    check_choice("method", method, METHODS)
    check_choice("domain", domain, DOMAINS)  # checked for the exact method too, which ignores it
    check_positive("epsilon", epsilon)
    max_iter = check_positive_int("max_iter", max_iter)
    if threshold is not None:
        check_non_negative("threshold", threshold)
    check_overrelaxation(overrelaxation)
    if method == "sinkhorn":
        result = sinkhorn(cost, a, b, epsilon=epsilon, max_iter=max_iter, threshold=threshold, domain=domain,
                          overrelaxation=overrelaxation)
        return EMDResult(result.plan, result.transport_cost, result.f, result.g, result.iterations, result.error,
                         result.converged)
    warn_of_ignored_sinkhorn_settings("emd", epsilon=epsilon, max_iter=max_iter, threshold=threshold, domain=domain,
                                      overrelaxation=overrelaxation)

    cost, a, b = prepare_problem(cost, a, b)
    if values_known(cost) and values_known(a) and values_known(b):
        n, m = cost.shape[-2], cost.shape[-1]
        _check_finite(*(ops.convert_to_numpy(x).reshape(-1, size) for x, size in
                        ((cost, n * m), (a, n), (b, m))))
    return _exact(cost, a, b)
