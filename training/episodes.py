"""N-way K-shot episodes, episodic meta-training and few-shot evaluation (mean accuracy +- 95 % confidence
interval), SPEC S5/S8."""
import os

import keras
import numpy as np
import tensorflow as tf

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
        self.seed = seed
        self.rng = np.random.default_rng(seed)

    def sample(self):
        """The next episode of this sampler's random stream."""
        return self._draw(self.rng)

    def episode(self, index):
        """Episode number ``index`` of the seed's fixed sequence: the same episode whatever was drawn before, so a
        resumed meta-training run and an evaluation see the same episodes."""
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


def meta_train(model, images, labels, episodes, optimizer, ways=5, shots=1, queries=15, seed=0, checkpoint_dir=None,
               checkpoint_every=100, jit_compile=True, log_every=50, verbose=1):
    """Episodic meta-training of a few-shot model (``zoo.few_shot_model``: inputs ``[query_images, support_images,
    support_labels]``, logits ``(queries * ways, ways)``) by cross-entropy on the query labels, one episode a step.

    Episode ``i`` is ``EpisodeSampler(labels, ways, shots, queries, seed).episode(i)`` drawn from ``images`` (raw
    pixels, as the model takes them). With ``checkpoint_dir`` the model, the optimizer and the episode counter are
    saved every ``checkpoint_every`` episodes (``tf.train.CheckpointManager``: written to a temporary file, then
    renamed) and a new call resumes after the last saved episode, drawing the same episodes an uninterrupted run
    would. Returns ``{"episode": [...], "loss": [...], "accuracy": [...]}``: means over each ``log_every`` episodes.
    """
    episodes = check_positive_int("episodes", episodes)
    sampler = EpisodeSampler(labels, ways, shots, queries, seed)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    done = tf.Variable(0, dtype=tf.int64, trainable=False)
    manager = None
    if checkpoint_dir is not None:
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, episodes_done=done)
        manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=1)
        if manager.latest_checkpoint:
            checkpoint.restore(manager.latest_checkpoint)

    @tf.function(jit_compile=jit_compile)
    def step(query, support, support_labels, query_labels):
        with tf.GradientTape() as tape:
            logits = model([query, support, support_labels], training=True)
            loss = loss_fn(query_labels, logits)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), query_labels), tf.float32)
        return loss, tf.reduce_mean(correct)

    history, window = {"episode": [], "loss": [], "accuracy": []}, []
    for index in range(int(done.numpy()), episodes):
        support, support_label, query, query_label = sampler.episode(index)
        loss, accuracy = step(tf.constant(images[query], tf.float32), tf.constant(images[support], tf.float32),
                              tf.constant(support_label, tf.int32), tf.constant(query_label, tf.int32))
        window.append((float(loss), float(accuracy)))
        done.assign(index + 1)
        if manager is not None and ((index + 1) % checkpoint_every == 0 or index + 1 == episodes):
            manager.save(checkpoint_number=index + 1)
        if (index + 1) % log_every == 0 or index + 1 == episodes:
            mean_loss, mean_accuracy = np.mean(window, axis=0)
            history["episode"].append(index + 1)
            history["loss"].append(float(mean_loss))
            history["accuracy"].append(float(mean_accuracy))
            window = []
            if verbose:
                print(f"episode {index + 1}/{episodes}: loss {mean_loss:.4f}, query accuracy {mean_accuracy:.4f}",
                      flush=True)
    return history


def few_shot_accuracy(model, images, labels, ways=5, shots=1, queries=15, episodes=1000, seed=0, batch_size=256,
                      verbose=0):
    """Mean accuracy and 95 % interval of few-shot model ``model`` on ``episodes`` N-way K-shot episodes
    (``EpisodeSampler(labels, ways, shots, queries, seed).episode(i)`` for ``i < episodes``) drawn from ``images``
    (raw pixels).

    The backbone runs once over ``images`` (inference mode, so each image's features are those the whole model
    computes for it in any episode); each episode then runs the model's class-mean and head layers
    (``zoo.tasks.few_shot_parts``). ``verbose``: a progress bar over the episodes. Returns ``{"mean", "ci95",
    "episodes"}`` (accuracies in [0, 1]).
    """
    from zoo.tasks import few_shot_parts

    episodes = check_positive_int("episodes", episodes)
    embed, classify = few_shot_parts(model)
    features = np.concatenate([np.asarray(embed(tf.constant(images[i:i + batch_size], tf.float32)))
                               for i in range(0, len(images), batch_size)])
    classify = tf.function(classify)
    sampler = EpisodeSampler(labels, ways, shots, queries, seed)
    accuracies = []
    progress = keras.utils.Progbar(episodes, unit_name="episode") if verbose else None
    for index in range(episodes):
        support, support_label, query, query_label = sampler.episode(index)
        logits = classify(tf.constant(features[query]), tf.constant(features[support]),
                          tf.constant(support_label, tf.int32))
        accuracies.append(float(np.mean(np.argmax(np.asarray(logits), axis=-1) == query_label)))
        if progress is not None:
            progress.update(index + 1, [("accuracy", accuracies[-1])])
    mean, ci95 = mean_and_ci95(accuracies)
    return {"mean": mean, "ci95": ci95, "episodes": episodes}


def episode_dataset(images, labels, episodes, ways=5, shots=1, queries=15, seed=0):
    """A ``tf.data.Dataset`` of ``episodes`` episodes as ``((query_images, support_images, support_labels),
    query_labels)``, episode ``i`` being ``EpisodeSampler(labels, ways, shots, queries, seed).episode(i)`` drawn from
    ``images`` (raw pixels): what ``model.fit`` takes to train a few-shot model (``zoo.few_shot_model``), one episode
    a step."""
    episodes = check_positive_int("episodes", episodes)
    sampler = EpisodeSampler(labels, ways, shots, queries, seed)
    images = np.asarray(images)

    def generate():
        for index in range(episodes):
            support, support_label, query, query_label = sampler.episode(index)
            yield ((images[query].astype(np.float32), images[support].astype(np.float32),
                    support_label.astype(np.int32)), query_label.astype(np.int32))

    shape = tuple(images.shape[1:])
    signature = ((tf.TensorSpec((ways * queries,) + shape, tf.float32),
                  tf.TensorSpec((ways * shots,) + shape, tf.float32), tf.TensorSpec((ways * shots,), tf.int32)),
                 tf.TensorSpec((ways * queries,), tf.int32))
    dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return dataset.apply(tf.data.experimental.assert_cardinality(episodes))
