"""Few-shot evaluation: mean accuracy over N-way K-shot episodes with its 95 % confidence interval."""
import keras
import numpy as np

from ot_layers.optional import tensorflow_if_installed
from ot_layers.validation import check_positive_int
from training.data.episodes import EpisodeSampler
from zoo.tasks import few_shot_parts

tf = tensorflow_if_installed("few-shot evaluation on TensorFlow")

Z_95 = 1.96


def mean_and_ci95(accuracies):
    """``(mean, 1.96 * sd / sqrt(episodes))`` of per-episode accuracies: the normal-approximation 95 % interval of
    the mean, with the sample standard deviation (``ddof=1``, as the project's seed tables use; over the usual
    hundreds of episodes it differs from the population one in the fifth decimal). One episode has no interval:
    NaN, not 0 (which read as certainty)."""
    accuracies = np.asarray(accuracies, dtype=np.float64).reshape(-1)
    if accuracies.size == 0:
        raise ValueError("`accuracies` is empty.")
    if accuracies.size == 1:
        return float(accuracies[0]), float("nan")
    return float(accuracies.mean()), float(Z_95 * accuracies.std(ddof=1) / np.sqrt(accuracies.size))


def _check_same_length(name, array, labels):
    """``array`` must hold one row per label: a longer one was sampled by the labels' indices without a word."""
    if len(array) != len(labels):
        raise ValueError(f"`{name}` has {len(array)} rows but `labels` has {len(labels)} entries.")


def _compilable(layer):
    """Whether ``layer`` and every layer inside it can run under XLA (not the exact EMD's host call)."""
    return layer.supports_jit and all(_compilable(inner) for inner in getattr(layer, "layers", ()))


def evaluate_episodes(features, labels, classifiers, ways=5, shots=1, queries=15, episodes=1000, seed=0):
    """Few-shot accuracy of each classifier on the same episodes drawn from precomputed ``features``.

    Episode ``i`` is ``EpisodeSampler(labels, ways, shots, queries, seed).episode(i)`` for ``i < episodes``: the
    episodes :func:`few_shot_accuracy` scores a model on for the same arguments, so classifiers on a model's features
    and the model itself are compared episode for episode (it drew the sampler's ``sample()`` stream before: other
    episodes for the same seed).
    ``classifiers``: ``{name: fn(support_features, support_label, query_features) -> scores (Q, ways)}``.
    Returns ``{name: {"mean": ..., "ci95": ..., "episodes": ...}}`` (accuracies in [0, 1]).
    """
    episodes = check_positive_int("episodes", episodes)
    sampler = EpisodeSampler(labels, ways, shots, queries, seed)
    features = np.asarray(features)  # a list is indexed by the episodes' index arrays too
    _check_same_length("features", features, np.asarray(labels))
    accuracies = {name: [] for name in classifiers}
    for index in range(episodes):
        support, support_label, query, query_label = sampler.episode(index)
        for name, classify in classifiers.items():
            scores = np.asarray(classify(features[support], support_label, features[query]))
            if scores.shape != (len(query), ways) or not np.all(np.isfinite(scores)):
                raise ValueError(f"`classifiers`: {name!r} must return finite scores of shape ({len(query)}, {ways}) "
                                 f"(queries, ways), got shape {scores.shape}"
                                 f"{'' if scores.shape != (len(query), ways) else ' with NaN or Inf'}.")
            accuracies[name].append(float(np.mean(np.argmax(scores, axis=1) == query_label)))
    report = {}
    for name, values in accuracies.items():
        mean, ci95 = mean_and_ci95(values)
        report[name] = {"mean": mean, "ci95": ci95, "episodes": episodes}
    return report


def few_shot_accuracy(model, images, labels, ways=5, shots=1, queries=15, episodes=1000, seed=0, batch_size=256,
                      verbose=0):
    """Mean accuracy and 95 % interval of few-shot model ``model`` on ``episodes`` N-way K-shot episodes
    (``EpisodeSampler(labels, ways, shots, queries, seed).episode(i)`` for ``i < episodes``) drawn from ``images``
    (raw pixels): the episodes :func:`evaluate_episodes` scores classifiers on for the same arguments.

    The backbone runs once over ``images`` (inference mode, so each image's features are those the whole model
    computes for it in any episode); each episode then runs the model's class-mean and head layers
    (``zoo.tasks.few_shot_parts``), compiled once: ``jax.jit`` on JAX, XLA on TensorFlow where every layer allows it
    (graph mode for the exact EMD's host call), eagerly on PyTorch. ``verbose``: a progress bar over the episodes.
    Returns ``{"mean", "ci95", "episodes"}`` (accuracies in [0, 1]).
    """

    episodes = check_positive_int("episodes", episodes)
    batch_size = check_positive_int("batch_size", batch_size)
    ways = check_positive_int("ways", ways)  # checked before it is compared with the model's
    shots, queries = check_positive_int("shots", shots), check_positive_int("queries", queries)
    embed, classify = few_shot_parts(model)
    model_ways = model.get_layer("class_means").ways  # few_shot_parts found the layer
    if ways != model_ways:
        raise ValueError(f"`ways` ({ways}) must be the model's {model_ways}: its episodes have {model_ways} classes.")
    sampler = EpisodeSampler(labels, ways, shots, queries, seed)  # checks the labels and the seed
    _check_same_length("images", images, np.asarray(labels))
    ops = keras.ops
    features = np.concatenate([ops.convert_to_numpy(embed(ops.convert_to_tensor(images[i:i + batch_size], "float32")))
                               for i in range(0, len(images), batch_size)])
    if keras.backend.backend() == "tensorflow":  # XLA: the DeepEMD preset's otzoo evaluate took 47 s, not 119 s
        classify = tf.function(classify, jit_compile=_compilable(model))
    elif keras.backend.backend() == "jax":
        import jax

        classify = jax.jit(classify)
    accuracies = []
    progress = keras.utils.Progbar(episodes, unit_name="episode") if verbose else None
    for index in range(episodes):
        support, support_label, query, query_label = sampler.episode(index)
        logits = classify(ops.convert_to_tensor(features[query]), ops.convert_to_tensor(features[support]),
                          ops.convert_to_tensor(support_label, "int32"))
        accuracies.append(float(np.mean(np.argmax(ops.convert_to_numpy(logits), axis=-1) == query_label)))
        if progress is not None:
            progress.update(index + 1, [("accuracy", accuracies[-1])])
    mean, ci95 = mean_and_ci95(accuracies)
    return {"mean": mean, "ci95": ci95, "episodes": episodes}
