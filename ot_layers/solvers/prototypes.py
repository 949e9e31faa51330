"""Data-independent hyperspherical prototypes (DL2PA, Saadabadi et al. 2024, Sec. 3.2.1).

``K`` unit vectors in ``R^d`` spread as far apart as possible: the aim is the smallest largest pairwise cosine
``max_{i != j} p_i . p_j`` (the spherical-code / Tammes problem).

- ``d >= K - 1``: the optimum is known in closed form, the simplex equiangular tight frame (ETF), every pairwise
  cosine ``-1/(K-1)``. It is built directly (:func:`simplex_etf`): the centered standard basis of ``R^K`` (Gram
  matrix ``I - 11'/K``) written in an orthonormal basis of its ``(K-1)``-dim span (a Householder reflection) and
  embedded in ``R^d`` by a random orthogonal map drawn from ``seed``; ``O(K d)`` work.
- ``d < K - 1``: projected Adam on the sphere minimizing a smooth surrogate of the max cosine, the log-sum-exp

      L_beta(P) = (1/beta) log sum_{i != j} exp(beta * p_i . p_j),      max cos <= L_beta <= max cos + log(K^2)/beta,

  with the sharpness ``beta`` raised geometrically from 1 to 1000 (and the step size lowered from 0.05 to 0.001)
  over ``steps`` steps, from ``restarts`` random starts; the iterate with the smallest true max cosine is kept.
  Saadabadi et al.'s uniformity loss ``log mean_{i != j} exp(-t ||p_i - p_j||^2)`` (Sec. 3.2.1, with ``t = 2``) equals
  ``beta * L_beta - 2t + const`` at ``beta = 2t``, since ``||p_i - p_j||^2 = 2 - 2 p_i . p_j`` on the sphere: the
  schedule starts from that objective at ``t = 0.5`` (the paper's ``t = 2`` is ``beta = 4``) and sharpens it
  towards the max cosine itself, which is what lets it reach the best known codes (12 points in ``R^3``: the
  icosahedron, ``1/sqrt(5)``; 24 in ``R^4``: the 24-cell, 0.5; 240 in ``R^8``: the E8 kissing configuration, 0.5;
  see ``docs/results/hyperspherical.md``).

Results are deterministic given the arguments (``seed``) and memoized in-process; nothing is written to disk.
"""
import numpy as np

from ot_layers.tensor_ops import normalize_rows_np, squared_distances_np
from ot_layers.validation import check_positive_int, check_seed

_CACHE = {}
_WORK_PER_CALL = 5e8  # the automatic number of restarts keeps restarts * K^2 * steps near this


def _gram(p):
    # p @ p.T on the same buffer takes OpenBLAS's syrk path, which is ~100x slower here than gemm on a copy
    return p @ np.ascontiguousarray(np.swapaxes(p, -1, -2))


def max_pairwise_cosine(prototypes):
    """``max_{i != j} cos(p_i, p_j)`` of the rows of ``prototypes`` ``(K, d)`` (float64)."""
    p = normalize_rows_np(np.asarray(prototypes, dtype=np.float64))
    cos = _gram(p)
    cos[np.eye(p.shape[0], dtype=bool)] = -np.inf
    return float(cos.max())


def uniformity_loss_and_gradient(prototypes, t):
    """Saadabadi et al.'s (2024, Sec. 3.2.1) uniformity loss
    ``L(P) = log(1/(K(K-1)) sum_{i != j} exp(-t ||p_i - p_j||^2))`` and its gradient w.r.t. the rows of
    ``prototypes`` ``(K, d)``: with ``E_ij = exp(-t ||p_i - p_j||^2)``,
    ``Z = sum E``, ``dL/dp_i = -(4 t / Z) sum_j E_ij (p_i - p_j)``. (The estimator below anneals the equivalent
    log-sum-exp of cosines; this is kept as the paper's reference objective.)"""
    p = np.asarray(prototypes, dtype=np.float64)
    k = p.shape[0]
    exponent = -t * squared_distances_np(p, p)
    np.fill_diagonal(exponent, -np.inf)
    shift = exponent.max()
    weights = np.exp(exponent - shift)
    z = weights.sum()
    loss = np.log(z) + shift - np.log(k * (k - 1))
    coeff = weights / z
    grad = -4.0 * t * (coeff.sum(axis=1, keepdims=True) * p - coeff @ p)
    return float(loss), grad


def simplex_etf(num_classes, dim, seed=0):
    """The simplex ETF: ``num_classes`` unit vectors in ``R^dim`` (``dim >= num_classes - 1``) with every pairwise
    cosine ``-1/(K-1)``, in an orientation drawn from ``seed``. Float64 ``(K, dim)``, ``O(K dim)`` work.

    The centered standard basis ``e_i - 1/K`` of ``R^K`` (Gram matrix ``I - 11'/K``) is written in the orthonormal
    basis ``H e_2, ..., H e_K`` of ``1^perp``, with ``H`` the Householder reflection swapping ``e_1`` and
    ``1/sqrt(K)``: its coordinates are the last ``K - 1`` columns of ``H``. They are padded with zeros to
    ``R^dim`` and moved by a random orthogonal map (a signed permutation of the coordinates followed by two
    Householder reflections about Gaussian vectors), then scaled to unit norm (by ``1/sqrt(1 - 1/K)``)."""
    k = check_positive_int("num_classes", num_classes)
    d = check_positive_int("dim", dim)
    if k < 2:
        raise ValueError(f"`num_classes` must be >= 2 to spread prototypes, got {num_classes!r}.")
    if d < k - 1:
        raise ValueError(f"`dim` must be >= num_classes - 1 = {k - 1} for a simplex ETF, got {dim!r}.")
    rng = np.random.default_rng(check_seed("seed", seed))
    u = np.full(k, -1.0 / np.sqrt(k))
    u[0] += 1.0  # H = I - 2 u u' / (u'u) maps e_1 to 1/sqrt(K)
    p = np.zeros((k, d))
    p[:, :k - 1] = np.eye(k)[:, 1:] - (2.0 / (u @ u)) * np.outer(u, u[1:])
    p = p[:, rng.permutation(d)] * rng.choice([-1.0, 1.0], size=d)
    for _ in range(2):
        w = rng.standard_normal(d)
        p -= (2.0 / (w @ w)) * np.outer(p @ w, w)
    return normalize_rows_np(p)


def _anneal(k, d, rng, restarts, steps):
    """Projected Adam on ``L_beta`` for ``restarts`` random starts at once; the best iterate by true max cos."""
    p = normalize_rows_np(rng.standard_normal((restarts, k, d)).astype(np.float32))  # float32: 3x faster here
    m, v = np.zeros_like(p), np.zeros_like(p)
    diagonal = np.where(np.eye(k, dtype=bool), -np.inf, 0.0).astype(np.float32)
    best_value = np.full(restarts, np.inf)
    best = p.copy()
    b1, b2 = 0.9, 0.999
    for step in range(steps + 1):
        cos = _gram(p) + diagonal
        worst = cos.max(axis=(1, 2))
        improved = worst < best_value
        best_value = np.where(improved, worst, best_value)
        best[improved] = p[improved]
        if step == steps:
            break
        frac = step / max(steps - 1, 1)
        beta = 1.0 * 1000.0 ** frac
        lr = 0.05 * 0.02 ** frac
        weights = np.exp(beta * (cos - worst[:, None, None]))
        weights /= weights.sum(axis=(1, 2), keepdims=True)
        grad = weights @ p  # (1/2) dL_beta/dp_i; Adam ignores the scale
        grad -= np.sum(grad * p, axis=-1, keepdims=True) * p  # tangent to the sphere
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad * grad
        p = normalize_rows_np(p - lr * (m / (1 - b1 ** (step + 1))) / (np.sqrt(v / (1 - b2 ** (step + 1))) + 1e-12))
    return best[int(np.argmin(best_value))]


def estimate_prototypes(num_classes, dim, seed=0, steps=2000, restarts=None):
    """``num_classes`` unit vectors in ``R^dim`` (rows of a float32 ``(K, d)`` array) with a small largest
    pairwise cosine (module docstring).

    ``dim >= num_classes - 1``: the simplex ETF in closed form (``steps``, ``restarts`` unused; ~0.1 s for
    ``K = 1000``). Otherwise ``restarts`` annealed runs of exactly ``steps`` projected-Adam steps each (a schedule
    that runs to its end: an exact count, hence ``steps`` and not a ``max_iter`` bound), run as one batch;
    ``restarts=None`` picks ``clip(5e8 / (K^2 steps), 1, 16)`` (16 up to ``K = 125``, 4 at ``K = 240``, 1 from
    ``K = 354`` at the default ``steps``). Measured: 0.5 s for (12, 3) and (24, 4), 3-4 s for (100, 16) and
    (240, 8) on a shared 2-core CPU. Deterministic given the arguments; memoized in-process (callers get copies).
    """
    k = check_positive_int("num_classes", num_classes)
    d = check_positive_int("dim", dim)
    if k < 2:
        raise ValueError(f"`num_classes` must be >= 2 to spread prototypes, got {num_classes!r}.")
    steps = check_positive_int("steps", steps)
    if restarts is None:
        restarts = int(np.clip(_WORK_PER_CALL / (k * k * steps), 1, 16))
    restarts = check_positive_int("restarts", restarts)
    seed = check_seed("seed", seed)
    closed_form = d >= k - 1
    key = (k, d, seed) if closed_form else (k, d, seed, steps, restarts)
    if key not in _CACHE:
        if closed_form:
            result = simplex_etf(k, d, seed)
        else:
            result = _anneal(k, d, np.random.default_rng(seed), restarts, steps)
        _CACHE[key] = normalize_rows_np(result.astype(np.float32))
    return _CACHE[key].copy()

