"""Class-balanced batches for metric learning: ``P`` classes x ``K`` samples per class in every batch."""
import keras
import numpy as np

from ot_layers.validation import check_positive_int


def class_balanced_indices(labels, classes_per_batch, samples_per_class, rng):
    """Indices of one batch: ``classes_per_batch`` distinct classes drawn uniformly, ``samples_per_class`` each.

    Samples are drawn without replacement inside a class when it has enough of them, with replacement otherwise.
    Returns an int64 array of length ``classes_per_batch * samples_per_class``, grouped by class.
    """
    labels = np.asarray(labels).reshape(-1)
    classes = np.unique(labels)
    if classes_per_batch > len(classes):
        raise ValueError(f"`classes_per_batch` ({classes_per_batch}) exceeds the number of classes ({len(classes)}).")
    chosen = rng.choice(classes, size=classes_per_batch, replace=False)
    batch = []
    for c in chosen:
        members = np.flatnonzero(labels == c)
        batch.append(rng.choice(members, size=samples_per_class, replace=len(members) < samples_per_class))
    return np.concatenate(batch).astype(np.int64)


class ClassBalancedBatches(keras.utils.PyDataset):
    """``model.fit`` input yielding ``steps_per_epoch`` batches ``(x[idx], y[idx])`` of ``P x K`` samples.

    Each batch holds ``classes_per_batch`` (P) classes with ``samples_per_class`` (K) samples each, drawn afresh
    for every batch from a seeded generator (reproducible for a given ``seed``).
    """

    def __init__(self, x, y, classes_per_batch, samples_per_class, steps_per_epoch, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = x, np.asarray(y).reshape(-1)
        if len(self.x) != len(self.y):
            raise ValueError(f"`x` has {len(self.x)} samples but `y` has {len(self.y)}.")
        self.classes_per_batch = check_positive_int("classes_per_batch", classes_per_batch)
        self.samples_per_class = check_positive_int("samples_per_class", samples_per_class)
        self.steps_per_epoch = check_positive_int("steps_per_epoch", steps_per_epoch)
        num_classes = len(np.unique(self.y))
        if self.classes_per_batch > num_classes:
            raise ValueError(f"`classes_per_batch` ({classes_per_batch}) exceeds the number of classes "
                             f"({num_classes}).")
        self.rng = np.random.default_rng(seed)
        self._draw_epoch()

    def _draw_epoch(self):
        self.batches = [class_balanced_indices(self.y, self.classes_per_batch, self.samples_per_class, self.rng)
                        for _ in range(self.steps_per_epoch)]

    def __len__(self):
        return self.steps_per_epoch

    def __getitem__(self, index):
        idx = self.batches[index]
        return self.x[idx], self.y[idx]

    def on_epoch_end(self):
        self._draw_epoch()
