"""Retrieval metrics: hand-computed cases, pytorch-metric-learning's AccuracyCalculator and scikit-learn's NMI."""
import numpy as np
import pytest

from training.evaluation.retrieval import _ranked_hits, kmeans_labels, normalized_mutual_info, retrieval_metrics


def test_hand_computed_one_dimensional():
    # Points on a line (euclidean): labels a a b a b b at positions 0 1 2.2 3 10 11 (no ties).
    x = np.array([[0.0], [1.0], [2.2], [3.0], [10.0], [11.0]])
    y = np.array([0, 0, 1, 0, 1, 1])
    m = retrieval_metrics(x, y, ks=(1, 2), metric="euclidean", nmi=False)
    # neighbour orders, R = 2 for every query:
    # q0: 1(a) 2(b)   R=2 -> AP = (1/1)/2 = 0.5 ; hit1 = 1
    # q1: 0(a) 2(b)   R=2 -> AP = 1/2         ; hit1 = 1
    # q2: 1(a) 3(a)   R=2 -> 0                  ; hit1 = 0, recall@2 = 0
    # q3: 2(b) 1(a)   R=2 -> (1/2)/2 = 0.25       ; hit1 = 0, recall@2 = 1
    # q4: 5(b) 3(a)   R=2 -> 1/2                ; hit1 = 1
    # q5: 4(b) 3(a)   R=2 -> 1/2                ; hit1 = 1
    np.testing.assert_allclose(m["precision_at_1"], 4 / 6)
    np.testing.assert_allclose(m["recall_at_1"], 4 / 6)
    np.testing.assert_allclose(m["recall_at_2"], 5 / 6)
    np.testing.assert_allclose(m["map_at_r"], (0.5 + 0.5 + 0 + 0.25 + 0.5 + 0.5) / 6)


def test_perfect_and_nmi():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(4), 10)
    x = np.eye(4)[y] * 10 + 0.01 * rng.normal(size=(40, 4))
    m = retrieval_metrics(x, y)
    assert m["precision_at_1"] == 1.0 and m["map_at_r"] == 1.0 and m["recall_at_8"] == 1.0
    np.testing.assert_allclose(m["nmi"], 1.0)


def test_nmi_matches_scikit_learn_on_random_labelings():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 120))
        a = rng.integers(0, int(rng.integers(1, 10)), n)
        b = rng.integers(0, int(rng.integers(1, 10)), n) + int(rng.integers(-3, 3))  # any label values
        assert abs(normalized_mutual_info(a, b) - metrics.normalized_mutual_info_score(a, b)) < 1e-10
    for a, b in (([0, 0, 0], [5, 5, 5]), ([0, 1, 2], [1, 1, 1]), ([0, 1, 2], [2, 0, 1]), ([], [])):
        assert abs(normalized_mutual_info(a, b) - metrics.normalized_mutual_info_score(a, b)) < 1e-10


def test_kmeans_nmi_of_well_separated_clusters_is_one():
    rng = np.random.default_rng(1)
    y = np.repeat(np.arange(6), 40)
    x = rng.normal(size=(6, 16))[y] * 50 + rng.normal(size=(240, 16))
    assert normalized_mutual_info(y, kmeans_labels(x, 6, seed=3)) == pytest.approx(1.0, abs=1e-12)
    np.testing.assert_array_equal(kmeans_labels(x, 6, seed=3), kmeans_labels(x, 6, seed=3))  # seeded


def test_rejects_bad_input():
    with pytest.raises(ValueError, match="labels"):
        retrieval_metrics(np.zeros((3, 2)), np.array([0, 0, 1]))
    with pytest.raises(ValueError, match="metric"):
        retrieval_metrics(np.zeros((4, 2)), np.array([0, 0, 1, 1]), metric="manhattan")


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_matches_pytorch_metric_learning(metric):
    torch = pytest.importorskip("torch")
    accuracy = pytest.importorskip("pytorch_metric_learning.utils.accuracy_calculator")
    inference = pytest.importorskip("pytorch_metric_learning.utils.inference")
    distances = pytest.importorskip("pytorch_metric_learning.distances")
    rng = np.random.default_rng(1)
    y = rng.integers(0, 8, size=300)
    x = (rng.normal(size=(8, 16))[y] + 1.5 * rng.normal(size=(300, 16))).astype(np.float32)
    distance = distances.CosineSimilarity() if metric == "cosine" else distances.LpDistance(normalize_embeddings=False)
    calculator = accuracy.AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r"),
                                             knn_func=inference.CustomKNN(distance))
    ref = calculator.get_accuracy(torch.tensor(x), torch.tensor(y), ref_includes_query=True)
    ours = retrieval_metrics(x, y, metric=metric, nmi=False)
    assert 0.2 < ours["map_at_r"] < 0.9  # the case is neither trivial nor hopeless
    np.testing.assert_allclose(ours["precision_at_1"], ref["precision_at_1"], atol=1e-6)
    np.testing.assert_allclose(ours["map_at_r"], ref["mean_average_precision_at_r"], atol=1e-6)


def _exact_precision_at_1(x, y):
    squared = ((np.asarray(x, np.float64)[:, None] - np.asarray(x, np.float64)[None]) ** 2).sum(-1)
    np.fill_diagonal(squared, np.inf)  # leave-one-out nearest neighbours, in float64
    return float(np.mean(y[squared.argmin(1)] == y))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_euclidean_ranking_does_not_depend_on_a_common_offset(dtype):
    """Distances do not change when every embedding moves by one vector; ``2 q.r - ||r||^2`` of the raw embeddings
    cancelled the differences away (P@1 0.08 instead of 0.875, MAP@R 0.03 instead of 0.54, for clusters 0.05 apart
    at an offset of 1000)."""
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), 20)
    x = 0.05 * (rng.normal(size=(200, 16)) + np.repeat(rng.normal(size=(10, 16)), 20, 0))
    centred = retrieval_metrics(x.astype(dtype), y, metric="euclidean", nmi=False)
    assert centred["precision_at_1"] == _exact_precision_at_1(x.astype(dtype), y)
    for offset in (100.0, 1000.0):
        shifted = (x + offset * rng.normal(size=16)).astype(dtype)  # float32 rounds the input itself a little
        metrics = retrieval_metrics(shifted, y, metric="euclidean", nmi=False)
        assert metrics["precision_at_1"] == _exact_precision_at_1(shifted, y)
        np.testing.assert_allclose(metrics["map_at_r"], centred["map_at_r"], atol=2e-3)


def test_chunked_ranking_equals_one_chunk():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 3, size=50)
    x = rng.normal(size=(50, 4))
    for metric in ("cosine", "euclidean"):
        np.testing.assert_array_equal(_ranked_hits(x, y, 20, metric, chunk_size=7),
                                      _ranked_hits(x, y, 20, metric, chunk_size=1000))


def test_non_finite_embeddings_raise():
    x = np.random.default_rng(0).normal(size=(6, 3))
    x[4, 0] = np.nan
    with pytest.raises(ValueError, match="embeddings"):
        retrieval_metrics(x, np.array([0, 0, 1, 1, 2, 2]), nmi=False)
