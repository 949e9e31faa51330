"""Data-independent hyperspherical prototypes (DL2PA, paper 001, SPEC S6).

``K`` unit vectors in ``R^d`` spread over the sphere by minimizing the Gaussian-potential uniformity loss

    L(P) = log( 1/(K(K-1)) * sum_{i != j} exp(-t * ||p_i - p_j||^2) ),      t = 2,

with plain gradient descent (lr 0.1, 1000 steps), re-normalizing every prototype after each step (paper 001,
Sec. 3.1, the prototype-estimation objective). For ``d >= K - 1`` the minimizer is a simplex ETF (all pairwise
cosines ``-1/(K-1)``). The result depends only on ``(K, d, steps, t, lr, seed)`` and is cached in-process and, when
``file_cache`` is on, as ``.npy`` under ``$KERAS_HOME/otzoo/prototypes/``.
"""
import os

import numpy as np

from ot_layers.validation import check_positive, check_positive_int

_CACHE = {}


def uniformity_loss_and_gradient(prototypes, t):
    """The uniformity loss ``L(P)`` above and its gradient w.r.t. the rows of ``prototypes`` ``(K, d)``.

    With ``E_ij = exp(-t ||p_i - p_j||^2)`` (``i != j``) and ``Z = sum E``:
    ``dL/dp_i = -(4 t / Z) * sum_j E_ij (p_i - p_j)``.
    """
    p = np.asarray(prototypes, dtype=np.float64)
    k = p.shape[0]
    sq_norms = np.sum(p * p, axis=1)
    sq_dist = np.maximum(sq_norms[:, None] + sq_norms[None, :] - 2.0 * p @ p.T, 0.0)
    exponent = -t * sq_dist
    np.fill_diagonal(exponent, -np.inf)
    shift = exponent.max()
    weights = np.exp(exponent - shift)
    z = weights.sum()
    loss = np.log(z) + shift - np.log(k * (k - 1))
    coeff = weights / z
    grad = -4.0 * t * (coeff.sum(axis=1, keepdims=True) * p - coeff @ p)
    return float(loss), grad


def _cache_path(key):
    root = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    name = "k{}_d{}_steps{}_t{}_lr{}_seed{}.npy".format(*key)
    return os.path.join(root, "otzoo", "prototypes", name)


def estimate_prototypes(num_classes, dim, steps=1000, t=2.0, seed=0, learning_rate=0.1, file_cache=True):
    """``num_classes`` unit vectors in ``R^dim`` (rows of a float32 ``(K, d)`` array) minimizing ``L(P)``.

    Random Gaussian start (``seed``), ``steps`` gradient steps of size ``learning_rate``, rows re-normalized after
    every step. Cached per ``(K, d, steps, t, learning_rate, seed)``.
    """
    k = check_positive_int("num_classes", num_classes)
    d = check_positive_int("dim", dim)
    if k < 2:
        raise ValueError(f"`num_classes` must be >= 2 to spread prototypes, got {num_classes!r}.")
    steps = check_positive_int("steps", steps)
    t = float(check_positive("t", t))
    learning_rate = float(check_positive("learning_rate", learning_rate))
    seed = int(seed)
    key = (k, d, steps, t, learning_rate, seed)
    if key in _CACHE:
        return _CACHE[key].copy()
    path = _cache_path(key) if file_cache else None
    if path is not None and os.path.exists(path):
        result = np.load(path).astype(np.float32)
    else:
        p = np.random.default_rng(seed).standard_normal((k, d))
        p /= np.linalg.norm(p, axis=1, keepdims=True)
        for _ in range(steps):
            _, grad = uniformity_loss_and_gradient(p, t)
            p -= learning_rate * grad
            p /= np.linalg.norm(p, axis=1, keepdims=True)
        result = p.astype(np.float32)
        if path is not None:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp.npy"
            np.save(tmp, result)
            os.replace(tmp, path)
    _CACHE[key] = result
    return result.copy()
