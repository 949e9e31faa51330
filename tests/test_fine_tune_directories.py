"""Fine-tuning a preset directory (an ``otzoo train`` run, an earlier fine-tuning run), not only a built-in preset:
it starts from the directory's weights, fits the loss of the directory's own recipe, and the card it writes keeps the
history of the runs before it."""
import json
import os
import shutil

import pytest

import zoo
from otzoo import cli
from training.recipes import retrieval
from training.recipes.fine_tune import fine_tune_preset, fine_tune_source

GAP = "resnet20_gap_fashion_mnist"
GSP = "resnet20_gsp_retrieval_fashion_mnist"


def _card(directory):
    with open(os.path.join(directory, "metadata.json"), encoding="utf-8") as handle:
        return json.load(handle)


def _copy_with_card(tmp_path, preset, **changes):
    directory = tmp_path / "copy"
    shutil.copytree(zoo.preset_dir(preset), directory)
    card = dict(_card(directory), **changes)
    (directory / "metadata.json").write_text(json.dumps(card))
    return str(directory)


@pytest.mark.fashion_mnist
def test_a_fine_tuned_run_fine_tunes_again_from_its_own_weights_and_keeps_the_history(tmp_path, capsys):
    first_dir, second_dir = str(tmp_path / "first"), str(tmp_path / "second")
    settings = dict(limit=256, learning_rate=0.05, seed=3, verbose=0)
    first = fine_tune_preset(GAP, first_dir, **settings)
    second = fine_tune_preset(first_dir, second_dir, **settings)
    first_before, first_after = first["fine_tuned"]["loss_on_slice_before_after"]
    second_before, _ = second["fine_tuned"]["loss_on_slice_before_after"]
    # The same slice and seed: the second run starts where the first ended, not from the packaged weights.
    assert abs(first_after - first_before) > 1e-3
    assert second_before == pytest.approx(first_after, abs=2e-4)

    tuned = second["fine_tuned"]
    assert tuned["base"] == GAP and tuned["preset_directory"] == first_dir
    assert second["name"] == f"{GAP}_fine_tuned" and second["metrics"] is None
    assert second["command"] == (f"otzoo fine-tune {first_dir} --out {second_dir} --epochs 1 --limit 256 "
                                 "--learning-rate 0.05 --seed 3")
    assert _card(second_dir) == json.loads(json.dumps(second))
    # Nothing of the history is lost: the first run's card, and through it the packaged preset's training run.
    before = _card(first_dir)
    assert tuned["base_run"]["command"] == before["command"] and tuned["base_run"]["fine_tuned"] == before["fine_tuned"]
    assert tuned["base_run"]["fine_tuned"]["base_run"]["metrics"] == zoo.model_card(GAP)["metrics"]
    assert tuned["base_run"]["fine_tuned"]["base_run"]["command"] == zoo.model_card(GAP)["command"]

    assert cli.main(["evaluate", second_dir, "--limit", "300"]) == 0  # read by the base preset's recipe
    assert "accuracy" in capsys.readouterr().out


@pytest.mark.fashion_mnist
def test_a_directory_is_fine_tuned_by_the_loss_of_its_cards_recipe(tmp_path):
    """A run trained with another loss (``otzoo train --recipe loss=proxy_anchor``) is fine-tuned with that loss,
    not with the built-in preset's ProxyNCA++."""
    card = zoo.model_card(GSP)
    recipe = dict(card["recipe"], loss="proxy_anchor", loss_kwargs={"margin": 0.2, "alpha": 16.0})
    directory = _copy_with_card(tmp_path, GSP, recipe=recipe)
    spec, read, base = fine_tune_source(directory)
    assert base == GSP and read["recipe"] == recipe and spec.architecture == zoo.registry.PRESETS[GSP].architecture
    loss = retrieval.fine_tune_setup(spec, zoo.load(directory), 256, 0, 128, 15).loss
    assert type(loss).__name__ == "ProxyAnchorLoss" and loss.margin == pytest.approx(0.2)
    loss = retrieval.fine_tune_setup(GSP, zoo.load(GSP), 256, 0, 128, 15).loss
    assert type(loss).__name__ == "ProxyNCAPlusPlusLoss"


@pytest.mark.parametrize("changes, message", [
    ({"name": "my_model"}, "it names no built-in preset (name 'my_model')"),
    ({"task": "retrieval"}, f"it states task 'retrieval', preset {GAP} is classification"),
    ({"dataset": "cifar10", "input_shape": [32, 32, 3]}, "trains on cifar10; fine-tuning reads Fashion-MNIST only"),
    ({"fine_tuned": "yes"}, "`fine_tuned` must be an object"),
], ids=["no_preset", "other_task", "other_dataset", "fine_tuned_string"])
def test_a_directory_that_cannot_be_fine_tuned_is_one_line_naming_it(changes, message, tmp_path, capsys):
    directory = _copy_with_card(tmp_path, GAP, **changes)
    out = str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"^`preset`: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        fine_tune_preset(directory, out)
    assert cli.main(["fine-tune", directory, "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("otzoo fine-tune: error: PRESET: ") and message in err, err
    assert not os.path.exists(out)


def test_fine_tune_preset_names_what_is_neither_a_preset_nor_a_directory(tmp_path):
    with pytest.raises(ValueError, match=r"`preset`: 'resnet20_nothing' is neither a preset \(.*\) nor a preset "
                                         "directory"):
        fine_tune_preset("resnet20_nothing", str(tmp_path / "out"))
    with pytest.raises(FileNotFoundError, match="is not a preset directory: it has no metadata.json"):
        fine_tune_preset(str(tmp_path), str(tmp_path / "out"))
    assert os.listdir(tmp_path) == []
