"""Evaluation: retrieval metrics on held-out classes."""
import numbers
import warnings

import numpy as np
from scipy.cluster.vq import kmeans2, vq

from ot_layers.tensor_ops import normalize_rows_np
from ot_layers.validation import check_class_ids, check_flag, check_seed


def _ranked_hits(embeddings, labels, k, metric, chunk_size=1024):
    """Boolean ``(N, k)``: whether each row's ``i``-th nearest other row shares its label (the row excluded).

    Works by chunks of queries: one matrix product, a partition to the ``k`` nearest and a sort of those only, in
    float32 (float64 for float64 input). Euclidean distances are ranked from the embeddings minus their mean (the
    same distances): ``2 q.r - ||r||^2`` of raw embeddings cancels their common offset away (float32 ranks of
    clusters 0.05 apart at an offset of 1000 were noise).
    """
    dtype = np.float64 if np.asarray(embeddings).dtype == np.float64 else np.float32
    if metric == "cosine":
        x = normalize_rows_np(np.asarray(embeddings, dtype=dtype), axis=1).astype(dtype)
        sq_norms = None
    else:
        x = np.asarray(embeddings)  # minus the mean taken in float64; no float64 copy of float32 embeddings
        x = x.astype(dtype, copy=False) - x.mean(axis=0, dtype=np.float64).astype(dtype)
        sq_norms = np.sum(x * x, axis=1)
    n = x.shape[0]
    hits = np.empty((n, k), dtype=bool)
    for start in range(0, n, chunk_size):
        stop = min(start + chunk_size, n)
        scores = x[start:stop] @ x.T  # larger is nearer
        if sq_norms is not None:  # -||q - r||^2 up to the query's own norm
            scores = 2.0 * scores - sq_norms[None, :]
        scores[np.arange(stop - start), np.arange(start, stop)] = -np.inf
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < n - 1 else np.argsort(-scores, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1)
        neighbours = np.take_along_axis(part, order, axis=1)
        hits[start:stop] = labels[neighbours] == labels[start:stop, None]
    return hits


def normalized_mutual_info(labels_true, labels_pred):
    """Normalized mutual information of two labelings, from their contingency table, normalized by the arithmetic
    mean of the two entropies (scikit-learn's ``normalized_mutual_info_score`` with its default
    ``average_method="arithmetic"``, including its limit cases: 1 when neither labeling splits the data)."""
    labels_true, labels_pred = np.asarray(labels_true).reshape(-1), np.asarray(labels_pred).reshape(-1)
    if labels_true.shape != labels_pred.shape:
        raise ValueError(f"the labelings have {labels_true.size} and {labels_pred.size} entries.")
    _, rows = np.unique(labels_true, return_inverse=True)
    _, cols = np.unique(labels_pred, return_inverse=True)
    n_rows, n_cols = int(rows.max(initial=-1)) + 1, int(cols.max(initial=-1)) + 1
    if n_rows == n_cols and n_rows <= 1:
        return 1.0
    contingency = np.bincount(rows * n_cols + cols, minlength=n_rows * n_cols).reshape(n_rows, n_cols)
    contingency = contingency.astype(np.float64)
    total = contingency.sum()
    p_rows, p_cols = contingency.sum(axis=1) / total, contingency.sum(axis=0) / total
    nz = contingency > 0
    joint = contingency[nz] / total
    outer = np.outer(p_rows, p_cols)[nz]
    mi = max(float(np.sum(joint * (np.log(joint) - np.log(outer)))), 0.0)
    if mi == 0.0:
        return 0.0

    def entropy(p):
        p = p[p > 0]
        return float(-np.sum(p * np.log(p)))

    return mi / ((entropy(p_rows) + entropy(p_cols)) / 2.0)


def kmeans_labels(x, clusters, seed=0, restarts=4, iterations=50):
    """k-means cluster indices of the rows of ``x``: ``restarts`` runs of SciPy's ``kmeans2`` (k-means++ seeding,
    ``iterations`` Lloyd steps) from seeds drawn from ``seed``; the run with the lowest inertia wins."""
    x = np.asarray(x, dtype=np.float64)
    best, best_inertia = None, np.inf
    for restart in range(restarts):
        with warnings.catch_warnings():  # an emptied cluster is kept empty (fewer clusters)
            warnings.simplefilter("ignore")
            centroids, _ = kmeans2(x, clusters, iter=iterations, minit="++",
                                   seed=np.random.default_rng([seed, restart]))
        labels, distances = vq(x, centroids, check_finite=False)
        inertia = float(np.sum(distances ** 2))
        if inertia < best_inertia:
            best, best_inertia = labels, inertia
    return best


def retrieval_metrics(embeddings, labels, ks=(1, 2, 4, 8), metric="cosine", nmi=True, seed=0):
    """Retrieval metrics with every sample as a query against all others (the query itself excluded).

    Returns a dict with ``precision_at_1``, ``map_at_r`` (mean over queries of
    ``(1/R) * sum_{i<=R} P(i) * rel_i`` with ``R`` the number of other samples of the query's class),
    ``recall_at_<k>`` (share of queries with a relevant sample among the ``k`` nearest) and, when ``nmi``,
    ``nmi``: normalized mutual information of k-means clusters (k = number of classes) with the labels.
    ``metric``: ``"cosine"`` or ``"euclidean"``. ``labels``: class ids >= 0; a negative one (-1 for an unlabelled
    sample, say) is refused rather than scored as a class of its own, which would make unlabelled samples each
    other's relevant neighbours (leave them out of ``embeddings`` and ``labels``).
    """
    embeddings = np.asarray(embeddings)
    labels = check_class_ids(labels, "labels")  # -1 (unlabelled) samples would be relevant to each other
    if not isinstance(ks, (list, tuple)) or not ks \
            or any(isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1 for k in ks):
        raise ValueError(f"`ks` must be a non-empty list of integers >= 1, got {ks!r}.")
    nmi = check_flag("nmi", nmi)
    seed = check_seed("seed", seed)
    if embeddings.ndim != 2:
        raise ValueError(f"`embeddings` must have shape (N, d), got {embeddings.shape}.")
    if labels.shape[0] != embeddings.shape[0]:
        raise ValueError(f"`labels` has {labels.shape[0]} entries but `embeddings` has {embeddings.shape[0]} rows.")
    if embeddings.shape[0] == 0:
        raise ValueError("`embeddings` hold no sample.")
    if not np.all(np.isfinite(embeddings)):
        raise ValueError("`embeddings` hold NaN or Inf.")
    if metric not in ("cosine", "euclidean"):
        raise ValueError(f"`metric` must be 'cosine' or 'euclidean', got {metric!r}.")
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    relevant_counts = counts[inverse] - 1
    if np.any(relevant_counts < 1):
        raise ValueError("`labels`: every class needs at least two samples for retrieval metrics.")
    max_k = int(min(embeddings.shape[0] - 1, max(max(ks), relevant_counts.max())))
    hits = _ranked_hits(embeddings, labels, max_k, metric)  # (N, max_k)

    positions = np.arange(1, max_k + 1, dtype=np.float32)
    relevant_hits = hits & (positions[None, :] <= relevant_counts[:, None])
    precision_at_i = np.cumsum(hits, axis=1, dtype=np.float32) / positions[None, :]
    map_at_r = np.sum(precision_at_i * relevant_hits, axis=1, dtype=np.float64) / relevant_counts

    result = {"precision_at_1": float(np.mean(hits[:, 0])), "map_at_r": float(np.mean(map_at_r))}
    for k in ks:
        result[f"recall_at_{k}"] = float(np.mean(np.any(hits[:, :k], axis=1)))
    if nmi:
        x = normalize_rows_np(embeddings, axis=1) if metric == "cosine" else embeddings
        clusters = kmeans_labels(x, len(counts), seed=seed)
        result["nmi"] = normalized_mutual_info(labels, clusters)
    return result
