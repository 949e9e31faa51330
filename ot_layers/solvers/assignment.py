"""Optimal one-to-one assignment (Hungarian algorithm) of classes to prototypes (DL2PA, Saadabadi et al. 2024).

``sigma = argmax_{bijection} sum_k S[k, sigma(k)]`` solved exactly by ``scipy.optimize.linear_sum_assignment`` on the
negated similarity matrix (Saadabadi et al. 2024, Sec. 3.2.3, Eq. 9, the label-to-prototype assignment problem).
"""
import numpy as np
from scipy.optimize import linear_sum_assignment


def hungarian_assignment(similarity):
    """For a ``(K, M)`` similarity matrix with ``K <= M``: the int64 array ``sigma`` (length ``K``) of distinct
    column indices maximizing ``sum_k similarity[k, sigma[k]]``."""
    s = np.asarray(similarity, dtype=np.float64)
    if s.ndim != 2:
        raise ValueError(f"`similarity` must be a (K, M) matrix, got shape {s.shape}.")
    if s.shape[0] > s.shape[1]:
        raise ValueError(f"`similarity` needs at least as many columns (prototypes) as rows (classes), got {s.shape}.")
    if not np.all(np.isfinite(s)):
        raise ValueError("`similarity` must be finite.")
    rows, cols = linear_sum_assignment(-s)
    sigma = np.empty(s.shape[0], dtype=np.int64)
    sigma[rows] = cols
    return sigma
