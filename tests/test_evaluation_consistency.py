"""The two few-shot evaluations draw the same episodes for the same arguments: ``evaluate_episodes`` (classifiers on
precomputed features) and ``few_shot_accuracy`` (a few-shot model on images) both score episode ``i`` of
``EpisodeSampler(labels, ways, shots, queries, seed).episode(i)``. ``evaluate_episodes`` drew the sampler's
``sample()`` stream instead, so a model and a classifier on its features, given the same seed, were scored on other
episodes: their accuracies could not be compared episode for episode."""
import numpy as np
import pytest

import zoo
from training.data.episodes import EpisodeSampler
from training.evaluation.few_shot import evaluate_episodes, few_shot_accuracy, mean_and_ci95
from zoo.tasks import few_shot_parts

OPTIONS = dict(ways=3, shots=2, queries=3, episodes=6, seed=4)


def _data():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(5), 8)
    images = rng.uniform(0, 255, (len(labels), 8, 8, 1)).astype(np.float32)
    images[:, :3] += 30.0 * labels[:, None, None, None]  # a class-dependent band: accuracies are not all chance
    return np.clip(images, 0, 255), labels


def test_a_model_and_a_classifier_on_its_features_are_scored_on_the_same_episodes():
    images, labels = _data()
    model = zoo.few_shot_model("small_convnet", head="protonet", ways=3, input_shape=(8, 8, 1),
                               backbone_kwargs=dict(width=4, feature_dim=4))
    embed, classify = few_shot_parts(model)
    features = np.asarray(embed(images))
    seen = []

    def head(support, support_label, query):  # the model's own head, on the features evaluate_episodes hands it
        seen.append((support, support_label, query))
        return np.asarray(classify(query, support, support_label))

    report = evaluate_episodes(features, labels, {"head": head}, **OPTIONS)["head"]

    sampler = EpisodeSampler(labels, OPTIONS["ways"], OPTIONS["shots"], OPTIONS["queries"], OPTIONS["seed"])
    assert len(seen) == OPTIONS["episodes"]
    accuracies = []
    for index, (support, support_label, query) in enumerate(seen):
        expected_support, expected_label, expected_query, query_label = sampler.episode(index)
        np.testing.assert_array_equal(support, features[expected_support])
        np.testing.assert_array_equal(support_label, expected_label)
        np.testing.assert_array_equal(query, features[expected_query])
        scores = np.asarray(classify(query, support, support_label))
        accuracies.append(np.mean(np.argmax(scores, axis=1) == query_label))
    mean, ci95 = mean_and_ci95(accuracies)
    assert report == {"mean": mean, "ci95": ci95, "episodes": OPTIONS["episodes"]}

    # the model on the images, embedded once and classified per episode: the same episodes, the same accuracies
    assert few_shot_accuracy(model, images, labels, **OPTIONS) == pytest.approx(report, abs=1e-12)
