"""Every packaged preset loads offline and reproduces its card on the real Fashion-MNIST test split (the card check
reads no data: it runs without Fashion-MNIST)."""
import re

import numpy as np
import pytest

import zoo
from zoo.loading import WEIGHTS_FILE, preset_dir, sha256_of

PRESETS = zoo.list_models()


@pytest.mark.parametrize("name", PRESETS)
def test_preset_is_packaged_with_a_complete_card(name):
    import os

    card = zoo.model_card(name)
    weights = os.path.join(preset_dir(name), WEIGHTS_FILE)
    assert os.path.isfile(weights), f"{name} has no packaged weights"
    assert card["weights_sha256"] == sha256_of(weights)
    for key in ("task", "dataset", "split", "recipe", "metrics", "parameters", "train_time_s", "hardware",
                "strategy", "command", "date"):
        assert card.get(key) is not None, f"{name}'s card lacks {key}"
    assert card["parameters"] == zoo.build(name).count_params()


@pytest.mark.slow
@pytest.mark.fashion_mnist
@pytest.mark.parametrize("name", [n for n in PRESETS if zoo.model_card(n)["task"] == "classification"])
def test_classification_preset_reproduces_its_card_then_fits(name):
    """Accuracy on all 10,000 test images within 0.3 points of the card; then one short fit runs from the
    pretrained weights (the user's first three lines: load, evaluate, fit)."""
    import keras

    from training.data.fashion_mnist import load_fashion_mnist
    from training.data.pipelines import image_dataset

    model = zoo.load(name)
    x, y = load_fashion_mnist("test", normalize=False)
    predicted = np.argmax(model.predict(image_dataset(x, y, 500), verbose=0), axis=-1)
    accuracy = float(np.mean(predicted == y))
    assert abs(accuracy - zoo.model_card(name)["metrics"]["accuracy"]) <= 0.003
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    x_train, y_train = load_fashion_mnist("train", limit=512, normalize=False)
    history = model.fit(image_dataset(x_train, y_train, 128, training=True), epochs=1, verbose=0)
    assert history.history["accuracy"][-1] > 0.8  # a pretrained model, not a fresh one (chance is 0.1)


@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_train_writes_a_card_that_evaluate_reproduces(tmp_path, capsys):
    """`otzoo train` on a slice writes weights and a card (recipe overrides and the reproducing command recorded);
    `evaluate_classification_preset` on those weights recomputes the card's accuracy."""
    import json
    import os

    from otzoo import cli
    from training.recipes.classification import evaluate as evaluate_classification_preset

    out = str(tmp_path / "run")
    status = cli.main(["train", "resnet20_gap_fashion_mnist", "--epochs", "1", "--limit", "512", "--seed", "3",
                       "--out", out])
    assert status == 0, capsys.readouterr().err
    with open(os.path.join(out, "metadata.json")) as handle:
        card = json.load(handle)
    assert card["recipe"]["seed"] == 3 and card["recipe"]["epochs"] == 1
    assert card["command"] == f"otzoo train resnet20_gap_fashion_mnist --out {out} --epochs 1 --limit 512 --seed 3"
    assert card["weights_sha256"] == sha256_of(os.path.join(out, WEIGHTS_FILE))
    result = evaluate_classification_preset("resnet20_gap_fashion_mnist", weights=out)
    assert abs(result["metrics"]["accuracy"] - card["metrics"]["accuracy"]) <= 1e-4


def _presets_of(task):
    return [n for n in PRESETS if zoo.model_card(n)["task"] == task]


@pytest.mark.slow
@pytest.mark.fashion_mnist
@pytest.mark.parametrize("name", _presets_of("retrieval"))
def test_retrieval_preset_reproduces_its_card_then_fits(name):
    """MAP@R and P@1 on the unseen classes' 5,000 test images within 0.3 points of the card; then one short
    proxy-loss fit from the pretrained weights, whose first batches already separate the seen classes."""
    import keras

    from ot_layers.losses import ProxyNCAPlusPlusLoss
    from training.data.fashion_mnist import fashion_mnist_split
    from training.data.pipelines import image_dataset
    from training.recipes.retrieval import evaluate as evaluate_retrieval_preset

    result = evaluate_retrieval_preset(name)
    card = zoo.model_card(name)["metrics"]
    for key in ("map_at_r", "precision_at_1"):
        assert abs(result["metrics"][key] - card[key]) <= 0.003, key
    model = zoo.load(name)
    train = zoo.proxy_training_model(model, num_classes=5)
    train.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss=ProxyNCAPlusPlusLoss(temperature=0.1))
    x, y = fashion_mnist_split("retrieval", "train", limit=1024, normalize=False, relabel=True)
    history = train.fit(image_dataset(x, y, 128, training=True), epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][-1])
    embeddings = model.predict(image_dataset(x, y, 256), verbose=0)
    same = (y[:, None] == y[None, :]) & ~np.eye(len(y), dtype=bool)
    cosines = embeddings @ embeddings.T
    assert cosines[same].mean() > cosines[y[:, None] != y[None, :]].mean() + 0.2  # a trained embedding, not random


@pytest.mark.slow
@pytest.mark.fashion_mnist
@pytest.mark.parametrize("name", [  # the DeepEMD card's 2,000 exact-EMD episodes: minutes on two cores (`long`)
    pytest.param(name, marks=[pytest.mark.long] if "emd" in name else []) for name in _presets_of("few_shot")])
def test_few_shot_preset_reproduces_its_card_then_fits(name):
    """Each setting's mean over the card's episodes (fixed episode seed) within the card's 95 % interval; then
    ``model.fit`` on a few base-class episodes, whose query accuracy is well above chance (a pretrained model)."""
    import keras

    from training.data.fashion_mnist import fashion_mnist_split
    from training.data.episodes import episode_dataset
    from training.recipes.few_shot import evaluate as evaluate_few_shot_preset

    result = evaluate_few_shot_preset(name)
    card = zoo.model_card(name)["metrics"]
    for setting, value in result["metrics"].items():
        assert abs(value["mean"] - card[setting]["mean"]) <= card[setting]["ci95"], setting
    model = zoo.load(name)
    model.compile(optimizer=keras.optimizers.SGD(0.001, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    x, y = fashion_mnist_split("few_shot", "base", limit=2000, normalize=False, relabel=True)
    history = model.fit(episode_dataset(x, y, 8, seed=11), epochs=1, verbose=0)
    assert history.history["accuracy"][-1] > 0.5  # chance is 0.2


def test_a_card_recipe_is_read_by_its_fields_types():
    """A card's recipe fields were taken whatever their type: tuple("15") made eval_shots ('1', '5'), an int
    callbacks failed in tuple(), a string jit_compile read as true."""
    from zoo.preset_format import PresetFormatError
    from zoo.spec import recipe_from_dict

    recipe = recipe_from_dict("few_shot", {"learning_rate": 1, "eval_shots": [1, 5], "pretrained_from": "x"})
    assert recipe.learning_rate == 1 and recipe.eval_shots == (1, 5)  # an integer is a number; unknown: left out
    assert recipe_from_dict("classification", {"callbacks": ["a"]}).callbacks == ("a",)
    for task, values, message in [("few_shot", {"eval_shots": "15"}, "`recipe.eval_shots` must be a list of integers"),
                                  ("few_shot", {"eval_shots": [1.5]}, "`recipe.eval_shots` must be a list of integers"),
                                  ("classification", {"epochs": True}, "`recipe.epochs` must be an integer, got True"),
                                  ("classification", {"epochs": 2.0}, "`recipe.epochs` must be an integer, got 2.0"),
                                  ("classification", {"nesterov": 1}, "`recipe.nesterov` must be true or false"),
                                  ("classification", {"loss_kwargs": []}, "`recipe.loss_kwargs` must be an object"),
                                  ("classification", {"optimizer": None}, "`recipe.optimizer` must be a string"),
                                  ("classification", ["epochs"], "`recipe` must be an object of recipe fields")]:
        with pytest.raises(PresetFormatError, match=f"^{re.escape(message)}"):  # one line from otzoo (exit 2)
            recipe_from_dict(task, values)
