"""Evaluation functions check their inputs: each was taken without a word (NaN labels scored as a class of their
own, a k of 0 or -1 reported, features longer than their labels sampled by index, a few-shot model of 3 ways scored
on 5-way episodes, scores of another shape) or failed with NumPy's error naming nothing."""
import keras
import numpy as np
import pytest

import zoo
from training.evaluation.few_shot import evaluate_episodes, few_shot_accuracy
from training.evaluation.retrieval import retrieval_metrics

RNG = np.random.default_rng(0)
LABELS = np.repeat(np.arange(4), 3)
EMBEDDINGS = np.eye(4)[LABELS] + 0.01 * RNG.normal(size=(12, 4))


@pytest.mark.parametrize("kwargs, match", [
    ({"labels": np.where(np.arange(12) < 3, np.nan, LABELS)}, r"^`labels` must be integer class labels, got .*nan"),
    ({"labels": LABELS.reshape(6, 2)}, r"^`labels` must be integer class labels of shape \(N,\)"),
    ({"ks": (0,)}, "^`ks` must be a non-empty list of integers >= 1"),
    ({"ks": (-1,)}, "^`ks`"),
    ({"ks": (True,)}, "^`ks`"),
    ({"ks": ()}, "^`ks`"),
    ({"ks": 4}, "^`ks`"),
    ({"ks": "12"}, "^`ks`"),
    ({"nmi": "no"}, "^`nmi` must be True or False"),
    ({"seed": -1}, "^`seed`"),
    ({"embeddings": np.zeros((0, 4)), "labels": np.zeros(0, int)}, "^`embeddings` hold no sample"),
    # -1 (unlabelled) was scored as a class of its own: unlabelled samples were each other's relevant neighbours
    ({"labels": np.where(np.arange(12) < 3, -1, LABELS)}, r"^`labels` must be class ids >= 0, got -1: .*unlabelled"),
])
def test_retrieval_metrics_names_a_bad_argument(kwargs, match):
    arguments = {"embeddings": EMBEDDINGS, "labels": LABELS, **kwargs}
    with pytest.raises(ValueError, match=match):
        retrieval_metrics(**arguments)


def _nearest_mean(support, support_label, query):
    means = np.stack([support[support_label == c].mean(0) for c in range(3)])
    return -((query[:, None] - means[None]) ** 2).sum(-1)


def test_evaluate_episodes_checks_features_and_the_scores_it_is_given():
    labels = np.repeat(np.arange(3), 5)
    features = np.eye(3)[labels]
    assert evaluate_episodes(features, labels, {"mean": _nearest_mean}, ways=3, queries=2, episodes=3)["mean"][
        "mean"] == 1.0
    with pytest.raises(ValueError, match="^`features` has 30 rows but `labels` has 15"):
        evaluate_episodes(np.concatenate([features, features]), labels, {"mean": _nearest_mean}, ways=3, queries=2)
    for bad in (lambda s, sl, q: np.full((len(q), 3), np.nan), lambda s, sl, q: np.zeros((1, 3)),
                lambda s, sl, q: np.zeros((len(q), 6))):
        with pytest.raises(ValueError, match="^`classifiers`: 'bad' must return finite scores of shape"):
            evaluate_episodes(features, labels, {"bad": bad}, ways=3, queries=2, episodes=2)


def test_few_shot_accuracy_refuses_other_ways_than_the_models_and_images_without_labels():
    model = zoo.few_shot_model("small_convnet", head="protonet", ways=3, input_shape=(8, 8, 1),
                               backbone_kwargs=dict(width=4, feature_dim=4))
    labels = np.repeat(np.arange(5), 4)
    images = RNG.uniform(0, 255, size=(20, 8, 8, 1)).astype("float32")
    with pytest.raises(ValueError, match=r"^`ways` \(5\) must be the model's 3"):
        few_shot_accuracy(model, images, labels, ways=5, shots=1, queries=2, episodes=2)
    with pytest.raises(ValueError, match="^`images` has 40 rows but `labels` has 20"):
        few_shot_accuracy(model, np.concatenate([images, images]), labels, ways=3, shots=1, queries=2, episodes=2)
    with pytest.raises(ValueError, match="^`batch_size` must be an integer >= 1"):
        few_shot_accuracy(model, images, labels, ways=3, shots=1, queries=2, episodes=2, batch_size=0)
    assert few_shot_accuracy(model, images, labels, ways=3, shots=1, queries=2, episodes=2)["episodes"] == 2


@pytest.mark.parametrize("kwargs, name", [
    (dict(ways="3"), "ways"),  # was "`ways` (3) must be the model's 3"
    (dict(ways=3.0), "ways"),
    (dict(ways=0), "ways"),
    (dict(shots=0), "shots"),
    (dict(queries=1.5), "queries"),
    (dict(episodes=True), "episodes"),
])
def test_few_shot_accuracy_names_a_bad_episode_size_before_comparing_with_the_model(kwargs, name):
    model = zoo.few_shot_model("small_convnet", head="protonet", ways=3, input_shape=(8, 8, 1),
                               backbone_kwargs=dict(width=4, feature_dim=4))
    labels = np.repeat(np.arange(5), 4)
    images = RNG.uniform(0, 255, size=(20, 8, 8, 1)).astype("float32")
    with pytest.raises(ValueError, match=f"^`{name}` must be an integer >= 1, got"):
        few_shot_accuracy(model, images, labels, **{**dict(ways=3, shots=1, queries=2, episodes=2), **kwargs})


def test_recipe_entry_points_name_their_arguments_before_any_work(tmp_path):
    """out_dir=None failed after the data were read and the model built; a list as preset, a string of overrides
    and None as a tuned configuration failed with Python's errors; a few-shot recipe's ways other than the model's
    meta-trained 3-way episodes on a 5-way model; callbacks=5 failed with Python's error after the model was built;
    labels outside the classifier's classes scored 0 silently."""
    from training.recipes import classification, evaluate_preset, train_preset
    from training.recipes.common import merged_overrides, preset_spec
    from training.recipes.tuned_config import load_tuned_config
    for call, match in [
        (lambda: train_preset("resnet20_gap_fashion_mnist", None), "^`out_dir` must be a directory path"),
        (lambda: train_preset("resnet20_gap_fashion_mnist", str(tmp_path / "a"), callbacks=5),
         "^`callbacks` must be a list of keras.callbacks.Callback"),
        (lambda: train_preset("resnet20_gsp_retrieval_fashion_mnist", str(tmp_path / "b"),
                              callbacks=keras.callbacks.History()), "^`callbacks` must be a list"),
        (lambda: evaluate_preset(["resnet20_gap_fashion_mnist"]), "^`preset` must be a preset name"),
        (lambda: merged_overrides("epochs=1"), "^`recipe_overrides` must be a dict"),
        (lambda: preset_spec("resnet20_protonet_fewshot_fashion_mnist", ways=3),
         r"^recipe field `ways` \(3\) must be the 5 ways of the preset's model"),
        (lambda: zoo.pixel_preprocessing(float("nan"), 0.25), r"^`mean` must be a number in \[0, 1\]"),
        (lambda: zoo.pixel_preprocessing("0.5", 0.25), r"^`mean` must be a number in \[0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
    with pytest.raises(FileNotFoundError, match="^`config`: no tuning result at None"):
        load_tuned_config(None)
    model = zoo.image_classifier("small_convnet", "gap_fc", 3, input_shape=(8, 8, 1),
                                 backbone_kwargs=dict(width=4, feature_dim=4))
    images = RNG.uniform(0, 255, size=(4, 8, 8, 1)).astype("float32")
    with pytest.raises(ValueError, match=r"^`labels` must be classes 0..2 of the model's logits, got labels from 0 "
                                         "to 99"):
        classification.classification_accuracy(model, images, np.array([0, 1, 2, 99]))
    assert 0.0 <= classification.classification_accuracy(model, images, np.array([0, 1, 2, 1])) <= 1.0


@pytest.mark.filterwarnings("ignore:Loading weights")  # the lone file below: no card to check it against
def test_weights_of_a_run_are_evaluated_by_the_recipe_of_its_card(tmp_path):
    """``otzoo evaluate NAME --weights RUN/model.weights.h5`` compared with the run's card but evaluated by the
    preset's recipe (1000 episodes per setting where the run's card says 3): the card's recipe, as ``otzoo evaluate
    RUN`` evaluates it."""
    import json
    import shutil

    from training.recipes.common import evaluation_target

    name = "resnet20_emd_fewshot_fashion_mnist"
    run = tmp_path / "run"
    shutil.copytree(zoo.preset_dir(name), run)
    card = json.loads((run / "metadata.json").read_text())
    card["recipe"].update(eval_episodes=3, eval_queries=5, eval_shots=[1])
    (run / "metadata.json").write_text(json.dumps(card))
    _, spec, read = evaluation_target(name, weights=str(run / "model.weights.h5"))
    _, directory_spec, _ = evaluation_target(str(run))
    assert read["recipe"]["eval_episodes"] == 3
    assert spec.recipe == directory_spec.recipe
    assert (spec.recipe.eval_episodes, spec.recipe.eval_queries, spec.recipe.eval_shots) == (3, 5, (1,))
    assert spec.architecture == zoo.registry.PRESETS[name].architecture
    lone = tmp_path / "lone.weights.h5"  # no card comes with it: the preset's recipe
    shutil.copy(run / "model.weights.h5", lone)
    assert evaluation_target(name, weights=str(lone))[1] == zoo.registry.PRESETS[name]


def test_the_limit_of_weights_with_a_card_is_checked_against_that_cards_recipe(tmp_path, capsys):
    """``--limit`` was checked against the preset's evaluation settings while the card's were evaluated: a card
    needing more images than the preset (40 queries) ended in a traceback deep in the episode sampler, and one
    needing fewer was refused a limit its directory is evaluated with."""
    import json
    import shutil

    from otzoo import cli
    from training.data.errors import EmptySliceError
    from training.recipes import evaluate_preset

    name = "resnet20_emd_fewshot_fashion_mnist"
    runs = {}
    for label, changes in (("more", dict(eval_queries=40)), ("fewer", dict(eval_queries=2, eval_shots=[1]))):
        run = tmp_path / label
        shutil.copytree(zoo.preset_dir(name), run)
        card = json.loads((run / "metadata.json").read_text())
        card["recipe"].update(changes)
        (run / "metadata.json").write_text(json.dumps(card))
        runs[label] = str(run / "model.weights.h5")
    with pytest.raises(EmptySliceError) as error:
        evaluate_preset(name, weights=runs["more"], limit=300)
    assert "with 40 queries need 5 classes of 45 images" in str(error.value), str(error.value)
    assert cli.main(["evaluate", name, "--weights", runs["more"], "--limit", "300"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    evaluate_preset(name, weights=runs["fewer"], limit=100, episodes=1)  # the card's 1-shot, 2-query episodes fit
