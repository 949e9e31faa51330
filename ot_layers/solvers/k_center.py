"""Greedy k-center selection (Gonzalez' 2-approximation), used to initialize prototypes and proxies.

Used by GSP's prototype initialization (Gurbuz 2022, ch. 5) and CCP's proxy re-initialization (ch. 3):
repeatedly add the point farthest (Euclidean) from everything chosen so far.
"""
import numpy as np

from ot_layers.tensor_ops import squared_distances_np
from ot_layers.validation import check_seed


def greedy_k_center(points, k, initial=None, seed=0):
    """Indices of ``k`` points of ``points`` ``(N, d)`` chosen greedily by farthest-point traversal.

    ``initial``: optional ``(P, d)`` centers already in place (e.g. current proxies); the first chosen point is then
    the one farthest from them. Without it, the first point is drawn at random (``seed``). The indices are distinct;
    when ``points`` hold fewer than ``k`` distinct rows (or rows equal to ``initial``), the later picks are rows at
    distance 0, the first such in order.
    Raises ``ValueError`` for non-finite ``points`` or ``initial`` (a NaN would silently win every ``argmax``).
    """
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2:
        raise ValueError(f"`points` must have shape (N, d), got {points.shape}.")
    if not np.all(np.isfinite(points)):
        raise ValueError(f"`points` must be finite; {int(np.sum(~np.isfinite(points).all(axis=1)))} rows hold NaN "
                         "or Inf.")
    n = points.shape[0]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ValueError(f"`k` must be an integer in [1, {n}] (the number of points), got {k!r}.")
    seed = check_seed("seed", seed)
    chosen = []
    if initial is not None and np.size(initial) == 0:
        initial = None  # no centers in place
    if initial is not None:
        initial = np.asarray(initial, dtype=np.float64)
        if initial.ndim != 2 or initial.shape[1] != points.shape[1]:
            raise ValueError(f"`initial` must have shape (P, {points.shape[1]}), got {initial.shape}.")
    if initial is not None and len(initial):
        if not np.all(np.isfinite(initial)):
            raise ValueError("`initial` must be finite.")
        distance = np.min(squared_distances_np(points, initial), axis=1)
    else:
        first = int(np.random.default_rng(seed).integers(n))
        chosen.append(first)
        distance = squared_distances_np(points, points[first:first + 1])[:, 0]
        distance[first] = -np.inf  # never chosen again, even where every other point is at distance 0
    while len(chosen) < k:
        nxt = int(np.argmax(distance))
        chosen.append(nxt)
        distance = np.minimum(distance, squared_distances_np(points, points[nxt:nxt + 1])[:, 0])
        distance[nxt] = -np.inf
    return np.asarray(chosen, dtype=np.int64)
