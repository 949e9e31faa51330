"""N-way K-shot episodes: the sampler, and the episodes as batches for ``model.fit``: :class:`EpisodeBatches`
(NumPy, every Keras backend) and :func:`episode_dataset` (the same batches as a ``tf.data`` pipeline)."""
import keras
import numpy as np

from ot_layers.optional import tensorflow_if_installed
from ot_layers.validation import check_class_ids, check_labels, check_non_negative_int, check_positive_int, check_seed
from training.data.arrays import check_arrays

tf = tensorflow_if_installed("episode pipelines (tf.data)")


class EpisodeSampler:
    """Draws N-way K-shot episodes with ``queries`` query samples per class from integer ``labels``.

    Each episode picks ``ways`` classes at random, then ``shots + queries`` distinct samples of each. ``sample()``
    returns ``(support_index, support_label, query_index, query_label)`` with labels relabelled to
    ``0..ways-1`` in the order the classes were drawn; the support set is grouped by class. Only classes with at
    least ``shots + queries`` samples are drawn; the others are left out. Negative labels (-1: unlabelled) are
    refused: they name no class.
    """

    def __init__(self, labels, ways=5, shots=1, queries=15, seed=0):
        self.ways = check_positive_int("ways", ways)
        self.shots = check_positive_int("shots", shots)
        self.queries = check_positive_int("queries", queries)
        labels = check_labels(labels)
        if labels.ndim != 1:
            raise ValueError(f"`labels` must be one-dimensional, got shape {labels.shape}.")
        labels = check_class_ids(labels, "labels")  # -1 (unlabelled) would be drawn as a class of its own
        classes, counts = np.unique(labels, return_counts=True)
        usable = classes[counts >= self.shots + self.queries]
        if len(usable) < self.ways:
            raise ValueError(f"`labels` has {len(usable)} classes with at least shots + queries = "
                             f"{self.shots + self.queries} samples; {self.ways}-way episodes need {self.ways}.")
        self.classes = usable
        self.members = {c: np.flatnonzero(labels == c) for c in usable}
        self.seed = check_seed("seed", seed)
        self.rng = np.random.default_rng(self.seed)

    def sample(self):
        """The next episode of this sampler's random stream."""
        return self._draw(self.rng)

    def episode(self, index):
        """Episode number ``index`` of the seed's fixed sequence: the same episode whatever was drawn before, so a
        resumed meta-training run and an evaluation see the same episodes."""
        index = check_non_negative_int("index", index)
        return self._draw(np.random.default_rng([int(self.seed), int(index)]))

    def _draw(self, rng):
        chosen = rng.choice(self.classes, self.ways, replace=False)
        support, query = [], []
        for c in chosen:
            picked = rng.choice(self.members[c], self.shots + self.queries, replace=False)
            support.append(picked[:self.shots])
            query.append(picked[self.shots:])
        support_label = np.repeat(np.arange(self.ways), self.shots)
        query_label = np.repeat(np.arange(self.ways), self.queries)
        return np.concatenate(support), support_label, np.concatenate(query), query_label

    def __iter__(self):
        while True:
            yield self.sample()


class EpisodeBatches(keras.utils.PyDataset):
    """Episodes ``0 .. episodes - 1`` of ``EpisodeSampler(labels, ways, shots, queries, seed)`` drawn from
    ``images`` (raw pixels), one episode a batch: item ``i`` is episode ``i`` as ``((query_images, support_images,
    support_labels), query_labels)`` (float32 pixels, int32 labels), what a few-shot model (``zoo.few_shot_model``)
    takes. NumPy only, so ``model.fit`` reads it on every Keras backend, without TensorFlow; an item depends on its
    index alone (``EpisodeSampler.episode``), whatever order Keras asks for them in."""

    def __init__(self, images, labels, episodes, ways=5, shots=1, queries=15, seed=0):
        super().__init__()
        self.episodes = check_positive_int("episodes", episodes)
        self.images = np.asarray(images)
        check_arrays(self.images, np.asarray(labels))
        self.sampler = EpisodeSampler(labels, ways, shots, queries, seed)

    def __len__(self):
        return self.episodes

    def __getitem__(self, index):
        if not 0 <= index < self.episodes:
            raise IndexError(f"episode {index} of {self.episodes}")
        support, support_label, query, query_label = self.sampler.episode(index)
        return ((self.images[query].astype(np.float32), self.images[support].astype(np.float32),
                 support_label.astype(np.int32)), query_label.astype(np.int32))


def episode_dataset(images, labels, episodes, ways=5, shots=1, queries=15, seed=0):
    """The batches of :class:`EpisodeBatches` (same arguments) as a ``tf.data.Dataset`` of known cardinality, for
    TensorFlow's input pipelines and ``tf.distribute``."""
    batches = EpisodeBatches(images, labels, episodes, ways, shots, queries, seed)
    shape = tuple(batches.images.shape[1:])
    signature = ((tf.TensorSpec((ways * queries,) + shape, tf.float32),
                  tf.TensorSpec((ways * shots,) + shape, tf.float32), tf.TensorSpec((ways * shots,), tf.int32)),
                 tf.TensorSpec((ways * queries,), tf.int32))
    dataset = tf.data.Dataset.from_generator(lambda: (batches[i] for i in range(len(batches))),
                                             output_signature=signature)
    return dataset.apply(tf.data.experimental.assert_cardinality(batches.episodes))
