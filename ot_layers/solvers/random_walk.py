"""Random-walk manifold similarity of a small point set (EDMS, Aziere and Todorovic 2019, Sec. 5, eq. 8-9).

For unit vectors ``x_1..x_n`` (a mini-batch plus the proxies, eq. 8; Aziere and Todorovic 2019 normalizes every
embedding to the unit sphere, Sec. 3): non-negative affinities ``S_ij = exp(x_i . x_j / temperature)`` with a zero
diagonal, ``S_bar = D^{-1/2} S D^{-1/2}`` (``D`` the row sums), and the closed-form limit of the random walk with
restart probability ``1 - alpha``. The paper takes the degrees ``D`` over ``S`` with its diagonal and zeros the
diagonal of ``S_bar`` afterwards; here the diagonal is zeroed first, so that ``D`` counts the edges the walk can
take (no self-loops) and every row of ``S_bar`` is normalized by those edges alone (with an ``exp`` affinity the
self-similarity ``exp(1 / temperature)`` would otherwise be the largest term of every degree):

    F = (1 - alpha) (I - alpha S_bar)^{-1},        (eq. 9; column n of F is F_n for the query e_n)

the fixed point of ``F <- alpha S_bar F + (1 - alpha) I``. ``F`` is symmetric; ``F_ij`` is the manifold similarity
of ``x_i`` and ``x_j``. Differentiable; leading batch axes are allowed. Written in ``keras.ops``: runs on the
TensorFlow, JAX and PyTorch backends.

Numerics (all exact rewrites of eq. 9 unless stated):

- the points are L2-normalized first (``tensor_ops.normalize_rows``), as in the paper; un-normalized input would
  otherwise overflow ``exp``. An all-zero row stays zero (cosine 0 to every point, affinity ``exp(0)``).
- ``S`` is computed as ``exp((x_i . x_j - m) / temperature)`` with ``m`` the largest off-diagonal cosine (held
  constant): ``S_bar`` is invariant to scaling ``S``, and the exponent is <= 0. A row whose affinities all
  underflow (a point far from all others at a tiny temperature) gets degree floored at 1e-30, so ``S_bar``'s row
  is zero: an isolated point, ``F_ii = 1 - alpha``.
- ``I - alpha S_bar`` is symmetric positive definite (eigenvalues in ``[1 - alpha, 1 + alpha]``, since ``S_bar``'s
  spectral radius is <= 1), so ``F`` comes from a linear solve (``keras.ops.solve``), never an explicit inverse.
- a point with a non-finite coordinate is cut out of the graph (its affinities set to 0): the other points'
  similarities and their gradients equal those of a run without it; its own row and column of ``F`` are NaN.
"""
from keras import ops

from ot_layers.tensor_ops import at_least, normalize_rows
from ot_layers.validation import check_in_range, check_positive

DEGREE_FLOOR = 1e-30


def random_walk_similarity(points, alpha=0.8, temperature=0.5):
    """Manifold similarity matrix ``F`` ``(..., n, n)`` float32 of ``points`` ``(..., n, d)`` (eq. 9).

    ``alpha`` in (0, 1): the walk's continue probability (0.8 in the paper); ``temperature`` > 0 divides the
    cosines inside the affinity ``exp(cos / temperature)`` (0.5).
    """
    f, valid = random_walk_similarity_and_mask(points, alpha, temperature)
    return ops.where(ops.logical_and(valid[..., :, None], valid[..., None, :]), f, ops.full_like(f, float("nan")))


def random_walk_similarity_and_mask(points, alpha=0.8, temperature=0.5):
    """``(F, valid)``: :func:`random_walk_similarity` without the NaN marking, for callers that keep computing
    with ``F`` (a NaN entry would poison their gradients through ``0 * NaN``): a point with a non-finite
    coordinate (``valid`` ``(..., n)`` False) is isolated, its row and column of ``F`` are ``(1 - alpha) e_i``."""
    alpha = float(check_in_range("alpha", alpha, 0.0, 1.0, low_open=True, high_open=True))
    temperature = float(check_positive("temperature", temperature))
    x = ops.convert_to_tensor(points)
    try:
        rank = len(x.shape)
    except ValueError:  # TensorFlow: a shape of unknown rank
        rank = None
    if rank is not None and rank < 2:
        raise ValueError(f"`points` must have shape (..., n, d), got {x.shape}.")
    if rank is not None and x.shape[-2] == 0:
        raise ValueError(f"`points` must hold n >= 1 points per set, got shape {tuple(x.shape)}.")
    if rank is not None and x.shape[-1] == 0:
        raise ValueError(f"`points` must have d >= 1 coordinates per point, got shape {tuple(x.shape)}.")
    x = ops.cast(x, "float32")
    n = ops.shape(x)[-2]
    valid = ops.all(ops.isfinite(x), axis=-1)  # (..., n)
    x = ops.where(valid[..., None], x, ops.zeros_like(x))
    # cosines do not change with a row's scale: bring rows above 1 down first, so that the squared norm of a row
    # with coordinates near 1e20 does not overflow float32 (to inf, a zero row, a uniform F)
    x = normalize_rows(x / at_least(ops.max(ops.abs(x), axis=-1, keepdims=True), 1.0))
    index = ops.arange(n, dtype="int32")
    off_diagonal = ops.not_equal(index[:, None], index[None, :])
    pairs = ops.logical_and(ops.logical_and(valid[..., :, None], valid[..., None, :]), off_diagonal)
    cosine = ops.einsum("...id,...jd->...ij", x, x)  # not matmul: TensorFlow's needs a known rank
    shift = ops.stop_gradient(ops.max(ops.where(pairs, cosine, ops.full_like(cosine, -1.0)), axis=(-2, -1),
                                      keepdims=True))
    exponent = ops.where(pairs, (cosine - shift) / temperature, ops.full_like(cosine, -float("inf")))
    affinity = ops.exp(exponent)  # masked before exp
    inv_sqrt_degree = ops.rsqrt(at_least(ops.sum(affinity, axis=-1), DEGREE_FLOOR))
    normalized = affinity * inv_sqrt_degree[..., :, None] * inv_sqrt_degree[..., None, :]
    identity = ops.zeros_like(normalized) + ops.eye(n, dtype="float32")
    return (1.0 - alpha) * ops.solve(identity - alpha * normalized, identity), valid
