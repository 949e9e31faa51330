"""N-way K-shot episodes and few-shot evaluation (mean accuracy +- 95 % confidence interval), SPEC S5/S8."""
import numpy as np

from ot_layers.validation import check_positive_int

Z_95 = 1.96


class EpisodeSampler:
    """Draws N-way K-shot episodes with ``queries`` query samples per class from integer ``labels``.

    Each episode picks ``ways`` classes at random, then ``shots + queries`` distinct samples of each. ``sample()``
    returns ``(support_index, support_label, query_index, query_label)`` with labels relabelled to
    ``0..ways-1`` in the order the classes were drawn; the support set is grouped by class.
    """

    def __init__(self, labels, ways=5, shots=1, queries=15, seed=0):
        self.ways = check_positive_int("ways", ways)
        self.shots = check_positive_int("shots", shots)
        self.queries = check_positive_int("queries", queries)
        labels = np.asarray(labels)
        if labels.ndim != 1:
            raise ValueError(f"`labels` must be one-dimensional, got shape {labels.shape}.")
        classes, counts = np.unique(labels, return_counts=True)
        usable = classes[counts >= self.shots + self.queries]
        if len(usable) < self.ways:
            raise ValueError(f"`labels` has {len(usable)} classes with at least shots + queries = "
                             f"{self.shots + self.queries} samples; {self.ways}-way episodes need {self.ways}.")
        self.classes = usable
        self.members = {c: np.flatnonzero(labels == c) for c in usable}
        self.rng = np.random.default_rng(seed)

    def sample(self):
        chosen = self.rng.choice(self.classes, self.ways, replace=False)
        support, query = [], []
        for c in chosen:
            picked = self.rng.choice(self.members[c], self.shots + self.queries, replace=False)
            support.append(picked[:self.shots])
            query.append(picked[self.shots:])
        support_label = np.repeat(np.arange(self.ways), self.shots)
        query_label = np.repeat(np.arange(self.ways), self.queries)
        return np.concatenate(support), support_label, np.concatenate(query), query_label

    def __iter__(self):
        while True:
            yield self.sample()


def mean_and_ci95(accuracies):
    """``(mean, 1.96 * std / sqrt(episodes))`` of per-episode accuracies."""
    accuracies = np.asarray(accuracies, dtype=np.float64)
    if accuracies.size == 0:
        raise ValueError("`accuracies` is empty.")
    return float(accuracies.mean()), float(Z_95 * accuracies.std() / np.sqrt(accuracies.size))


def evaluate_episodes(features, labels, classifiers, ways=5, shots=1, queries=15, episodes=1000, seed=0):
    """Few-shot accuracy of each classifier on the same episodes drawn from precomputed ``features``.

    ``classifiers``: ``{name: fn(support_features, support_label, query_features) -> scores (Q, ways)}``.
    Returns ``{name: {"mean": ..., "ci95": ..., "episodes": ...}}`` (accuracies in [0, 1]).
    """
    episodes = check_positive_int("episodes", episodes)
    sampler = EpisodeSampler(labels, ways, shots, queries, seed)
    accuracies = {name: [] for name in classifiers}
    for _ in range(episodes):
        support, support_label, query, query_label = sampler.sample()
        for name, classify in classifiers.items():
            scores = np.asarray(classify(features[support], support_label, features[query]))
            accuracies[name].append(float(np.mean(np.argmax(scores, axis=1) == query_label)))
    report = {}
    for name, values in accuracies.items():
        mean, ci95 = mean_and_ci95(values)
        report[name] = {"mean": mean, "ci95": ci95, "episodes": episodes}
    return report
