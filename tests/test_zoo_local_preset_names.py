"""``zoo.load(NAME)`` where the working directory holds a preset directory named like the built-in preset ``NAME``
(``otzoo fine-tune NAME --out NAME``, ``otzoo train NAME --out NAME``): the bare name stays the built-in preset, as
before, but no longer without a word; ``./NAME`` is the directory."""
import os
import shutil
import warnings

import numpy as np
import pytest

import zoo
from zoo import loading

NAME = "resnet20_gap_fashion_mnist"


def _weights(model):
    return [np.asarray(w) for w in model.get_weights()]


def _same_weights(a, b):
    return all(np.array_equal(x, y) for x, y in zip(_weights(a), _weights(b)))


def _local_preset(folder):
    """A preset directory ``folder/NAME`` holding other weights than the packaged ones (a fine-tuned run's, say)."""
    model = zoo.load(zoo.preset_dir(NAME))
    model.set_weights([w + 1.0 for w in _weights(model)])
    zoo.save_preset(model, str(folder / NAME), card=dict(zoo.model_card(NAME), name=NAME))
    return model


def _loaded(*args, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = zoo.load(*args, **kwargs)
    return model, [str(w.message) for w in caught if "working directory" in str(w.message)]


def test_a_bare_preset_name_loads_the_built_in_preset_and_says_how_to_load_the_directory(tmp_path, monkeypatch):
    packaged = zoo.load(zoo.preset_dir(NAME))
    local = _local_preset(tmp_path)
    monkeypatch.chdir(tmp_path)

    model, said = _loaded(NAME)
    assert _same_weights(model, packaged) and not _same_weights(model, local)  # back-compatible: the built-in
    assert said == [f"zoo.load('{NAME}') loads the built-in preset {NAME} with its packaged weights, not the preset "
                    f"directory ./{NAME} in the working directory; zoo.load('./{NAME}') loads the directory."]
    assert _loaded(NAME)[1] == []  # once

    directory, said = _loaded(f"./{NAME}")  # what the warning says to write: the directory
    assert _same_weights(directory, local) and said == []


def test_no_warning_where_nothing_else_would_load(tmp_path, monkeypatch):
    """``weights=`` and ``pretrained=False`` say what loads; a folder without a card is no preset; a run's default
    folder (``otzoo_runs/NAME``) does not take the name; the package's own directory is the preset."""
    _local_preset(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert _loaded(NAME, weights=f"./{NAME}")[1] == []
    assert _loaded(NAME, pretrained=False)[1] == []
    assert loading.shadowed_directory(NAME) == os.path.join(".", NAME)

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / NAME).mkdir(parents=True)  # a folder of that name without a card (metadata.json)
    shutil.copytree(tmp_path / NAME, elsewhere / "otzoo_runs" / NAME)
    monkeypatch.chdir(elsewhere)
    assert loading.shadowed_directory(NAME) is None and _loaded(NAME)[1] == []

    monkeypatch.chdir(loading.PRESETS_DIR)
    assert loading.shadowed_directory(NAME) is None and _loaded(NAME)[1] == []


@pytest.mark.parametrize("overrides", [{}, {"num_classes": 10}])
def test_the_warning_points_at_the_callers_line(tmp_path, monkeypatch, overrides):
    _local_preset(tmp_path)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        zoo.load(NAME, **overrides)
    shadowed = [w for w in caught if "working directory" in str(w.message)]
    assert len(shadowed) == 1 and shadowed[0].filename == __file__


def test_a_command_names_its_own_way_to_the_directory(tmp_path, monkeypatch, capsys):
    """``zoo.load``'s warning tells Python's way (``zoo.load('./NAME')``); ``otzoo demo``, which loads a built-in
    preset by its name and takes no directory, says its own: the commands that take the directory. Those commands
    (evaluate, export, fine-tune, explain) refuse the bare name there as ambiguous."""
    from otzoo.arguments import packaged_weights_note
    from otzoo.cli import main

    _local_preset(tmp_path)
    monkeypatch.chdir(tmp_path)
    local = os.path.join(".", NAME)
    assert packaged_weights_note("demo", NAME) == (
        f"{NAME} is the built-in preset with its packaged weights, not the preset directory {local} here; otzoo demo "
        f"takes built-in presets only (otzoo evaluate, export, fine-tune and explain take {local})")
    for command in ("fine-tune", "explain", "train"):  # train: from scratch, no weights are loaded
        assert packaged_weights_note(command, NAME) is None
    for command in (["evaluate"], ["export", "--out", "served"], ["fine-tune", "--out", "tuned"],
                    ["explain", "--out", "pictures"]):
        with pytest.raises(SystemExit) as exit_info:  # argparse's refusal exits; the command's is returned
            raise SystemExit(main([command[0], NAME, *command[1:]]))
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and f"is both a built-in preset and a preset directory here: write {local}" \
            in err, (command, err)
    monkeypatch.chdir(tmp_path.parent)
    assert packaged_weights_note("demo", NAME) is None


@pytest.mark.fashion_mnist
def test_otzoo_fine_tune_refuses_the_bare_name_and_fine_tunes_the_directory(tmp_path, monkeypatch, capsys):
    """``otzoo fine-tune NAME --out NAME`` leaves ``./NAME``: a second ``otzoo fine-tune NAME`` is ambiguous (it
    fine-tuned the packaged weights with a note), and ``./NAME`` fine-tunes the directory's weights."""
    import json

    from otzoo.cli import main

    _local_preset(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fine-tune", NAME, "--out", "tuned", "--limit", "128"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "is both a built-in preset and a preset directory here: write ./" in err
    assert not os.path.exists(tmp_path / "tuned")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["fine-tune", f"./{NAME}", "--out", "tuned", "--limit", "128", "--epochs", "1"]) == 0
    assert [str(w.message) for w in caught if "working directory" in str(w.message)] == []
    tuned = json.loads((tmp_path / "tuned" / "metadata.json").read_text())["fine_tuned"]
    assert tuned["base"] == NAME and tuned["preset_directory"] == f"./{NAME}"
