"""``otzoo explain``: --help documents every option; bad input is one line naming the option, exit status 2; a real
run on the pretrained MPW preset writes the pictures it prints."""
import os
import shutil
import subprocess
import sys

import pytest
from PIL import Image

import zoo
from explain.report import KINDS
from otzoo import cli
from otzoo.arguments import ArgumentParser
from zoo.loading import preset_dir

OPTIONS = ("PRESET", "IMAGE", "--test-index", "--out", "--kinds", "--weights", "--top-k", "--gallery-size", "--seed",
           "--dpi")


def _main(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(cli.main(args))
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err.strip()


def test_explain_is_an_otzoo_command():
    result = subprocess.run([sys.executable, "-m", "otzoo", "--help"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0 and "    explain " in result.stdout


def test_help_documents_every_option_and_kind(capsys):
    code, out, _ = _main(["explain", "--help"], capsys)
    assert code == 0
    for option in OPTIONS:
        assert option in out, option
    for kind in KINDS:
        assert f"  {kind} " in out, kind
    # every option of the parser is in the list above (a new option must be documented and tested)
    import argparse

    commands = argparse.ArgumentParser().add_subparsers()
    from otzoo.explain_command import register

    parser = register(commands, ArgumentParser)
    declared = {s for action in parser._actions for s in action.option_strings if s.startswith("--")} - {"--help"}
    assert declared == {o for o in OPTIONS if o.startswith("--")}


@pytest.mark.parametrize("args, message", [
    (["explain", "resnet99", "--out", "x"], "argument PRESET: 'resnet99' is neither a preset ("),
    (["explain", "resnet20_mpw_fashion_mnist", "/nonexistent/boot.png", "--out", "x"],
     "IMAGE: no image file at '/nonexistent/boot.png'"),
    (["explain", "resnet20_mpw_fashion_mnist", "--test-index", "-1", "--out", "x"],
     "argument --test-index: must be an integer >= 0"),
    (["explain", "resnet20_mpw_fashion_mnist", "--kinds", "maps", "--out", "x"], "argument --kinds: invalid choice"),
    (["explain", "resnet20_mpw_fashion_mnist", "--top-k", "0", "--out", "x"], "argument --top-k: must be an integer"),
    (["explain", "resnet20_mpw_fashion_mnist"], "the following arguments are required: --out"),
    # an image after an option is an image (argparse left it as an unrecognized argument)
    (["explain", "resnet20_mpw_fashion_mnist", "--out", "x", "/nonexistent/shirt.png"],
     "IMAGE: no image file at '/nonexistent/shirt.png'"),
    (["explain", "resnet20_mpw_fashion_mnist", "--out", "x", "--bogus"], "unrecognized arguments: --bogus"),
    # an image after --test-index's integers is an image (it was read as an index and refused)
    (["explain", "resnet20_mpw_fashion_mnist", "--test-index", "3", "/nonexistent/shirt.png", "--out", "x"],
     "IMAGE: no image file at '/nonexistent/shirt.png'"),
    (["explain", "resnet20_mpw_fashion_mnist", "--test-index", "shirt.png", "--out", "x"],
     "argument --test-index: must be an integer >= 0, got 'shirt.png'"),
    (["list", "extra"], "unrecognized arguments: extra"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    code, _, err = _main(args, capsys)
    assert code == 2
    assert message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.fashion_mnist
def test_more_neighbours_than_the_gallery_holds_is_one_line_before_anything_is_written(tmp_path, capsys):
    """--top-k above the gallery's images failed in the ranking with a traceback, leaving an empty --out."""
    out = tmp_path / "out"
    code, _, err = _main(["explain", "resnet20_gsp_retrieval_fashion_mnist", "--kinds", "retrieval", "--top-k", "50",
                          "--gallery-size", "3", "--out", str(out)], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--top-k 50: the gallery holds 2 image(s) to rank" in err
    assert not out.exists()


@pytest.mark.fashion_mnist
def test_an_unreadable_log_beside_the_weights_leaves_out_the_curves_in_one_line(tmp_path, capsys):
    """An empty log.csv beside --weights failed in the plot with a traceback, leaving an empty --out."""
    weights = tmp_path / "weights"
    weights.mkdir()
    for name in ("model.weights.h5", "metadata.json"):
        shutil.copy(os.path.join(preset_dir("resnet20_gap_fashion_mnist"), name), weights / name)
    (weights / "log.csv").write_text("")
    out = tmp_path / "out"
    code, _, err = _main(["explain", "resnet20_gap_fashion_mnist", "--weights", str(weights), "--kinds", "curves",
                          "--out", str(out)], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "'curves' does not fit" in err and "the training log beside the weights cannot be read" in err
    assert not out.exists()


def test_test_index_takes_its_integers_and_leaves_the_images():
    import argparse

    from otzoo.explain_command import register

    parser = register(argparse.ArgumentParser().add_subparsers(), ArgumentParser)
    args = parser.parse_args(["resnet20_mpw_fashion_mnist", "a.png", "--test-index", "3", "4", "b.png", "c.png",
                              "--test-index", "7", "--out", "x"])
    assert args.test_index == [3, 4, 7]
    assert args.images == ["a.png"] and args.images_after_options == ["b.png", "c.png"]


@pytest.mark.fashion_mnist
def test_out_of_range_index_and_unfitting_kind(tmp_path, capsys):
    code, _, err = _main(["explain", "resnet20_mpw_fashion_mnist", "--test-index", "10000", "--out", str(tmp_path)],
                         capsys)
    assert code == 2 and "--test-index: 10000 is out of range" in err and len(err.splitlines()) == 1
    code, _, err = _main(["explain", "resnet20_gap_fashion_mnist", "--kinds", "mpw", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--kinds: 'mpw' does not fit preset resnet20_gap_fashion_mnist" in err
    assert len(err.splitlines()) == 1


@pytest.mark.fashion_mnist
def test_explain_the_mpw_preset_on_a_test_image_and_a_file(tmp_path, capsys):
    from training.data.fashion_mnist import load_fashion_mnist

    x, _ = load_fashion_mnist("test", limit=2, normalize=False)
    Image.fromarray(x[1, ..., 0]).save(tmp_path / "pullover.png")
    out = tmp_path / "pictures"
    code, printed, err = _main(["explain", "resnet20_mpw_fashion_mnist", str(tmp_path / "pullover.png"),
                                "--test-index", "0", "--out", str(out), "--gallery-size", "50", "--top-k", "3",
                                "--dpi", "40"], capsys)
    assert code == 0, err
    expected = [f"mpw: {out}/mpw_pullover.png", f"mpw: {out}/mpw_test00000.png", f"retrieval: {out}/retrieval.png",
                f"curves: {out}/curves.png"]
    assert printed.splitlines() == expected
    for line in expected:
        assert os.path.getsize(line.split(": ")[1]) > 0


@pytest.mark.fashion_mnist
def test_the_curves_are_those_of_the_weights_explained(tmp_path, capsys, monkeypatch):
    """``--weights`` of an ``otzoo train`` run: the curves come from the run's log.csv (its signal columns included),
    not from the packaged preset's train_log.csv, which belongs to other weights; a weights file outside a preset
    directory has no log, and ``--kinds curves`` says so in one line."""
    import shutil

    import explain.plots
    from zoo.loading import preset_dir

    preset, drawn = "resnet20_mpw_fashion_mnist", []
    original = explain.plots.plot_training_curves

    def recording(logs, path, dpi=100):
        drawn.append(dict(logs))
        return original(logs, path, dpi)

    monkeypatch.setattr(explain.plots, "plot_training_curves", recording)
    run = tmp_path / "run"  # what `otzoo train --out run` leaves: config, weights, card and log.csv
    os.makedirs(run)
    for name in ("config.json", "model.weights.h5", "metadata.json"):
        shutil.copy(os.path.join(preset_dir(preset), name), run / name)
    (run / "log.csv").write_text("epoch,loss,mpw_head_sinkhorn_iterations,val_loss\n0,2.0,7.0,2.5\n1,1.0,5.0,1.5\n")
    code, printed, err = _main(["explain", preset, "--weights", str(run), "--kinds", "curves", "--out",
                                str(tmp_path / "pictures"), "--dpi", "40"], capsys)
    assert code == 0, err
    assert drawn == [{preset: str(run / "log.csv")}]
    assert printed.splitlines() == [f"curves: {tmp_path / 'pictures' / 'curves.png'}"]
    # the run's directory as PRESET: drawn as the preset its card names, with the run's weights and log
    code, printed, err = _main(["explain", str(run), "--kinds", "curves", "--out", str(tmp_path / "by_directory"),
                                "--dpi", "40"], capsys)
    assert code == 0, err
    assert drawn[1:] == [{preset: str(run / "log.csv")}]
    assert printed.splitlines() == [f"curves: {tmp_path / 'by_directory' / 'curves.png'}"]

    shutil.copy(run / "model.weights.h5", tmp_path / "other.weights.h5")
    code, _, err = _main(["explain", preset, "--weights", str(tmp_path / "other.weights.h5"), "--kinds", "curves",
                          "--out", str(tmp_path / "pictures")], capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert "--kinds: 'curves' does not fit preset resnet20_mpw_fashion_mnist (no training log goes with" in err
    assert len(drawn) == 2


@pytest.mark.fashion_mnist
def test_a_few_shot_preset_draws_its_meta_training_from_its_card(tmp_path, capsys, monkeypatch):
    """The DeepEMD preset's curves: its pre-training log (train_log.csv, by epoch) and, apart, its card's
    meta-training history (loss and query accuracy by episode) as meta_training.png."""
    import explain.plots

    preset, drawn = "resnet20_emd_fewshot_fashion_mnist", []
    original = explain.plots.plot_training_curves

    def recording(logs, path, dpi=100):
        drawn.append((os.path.basename(path), dict(logs)))
        return original(logs, path, dpi)

    monkeypatch.setattr(explain.plots, "plot_training_curves", recording)
    out = tmp_path / "pictures"
    code, printed, err = _main(["explain", preset, "--kinds", "curves", "--out", str(out), "--dpi", "40"], capsys)
    assert code == 0, err
    assert printed.splitlines() == [f"curves: {out / 'curves.png'}", f"curves: {out / 'meta_training.png'}"]
    card = zoo.model_card(preset)
    assert [name for name, _ in drawn] == ["curves.png", "meta_training.png"]
    assert drawn[1][1] == {"meta-training": card["meta_training"]} and len(card["meta_training"]["episode"]) > 1
    assert all(os.path.getsize(out / name) > 0 for name, _ in drawn)


@pytest.mark.fashion_mnist
def test_the_weights_of_a_tuned_run_are_drawn_with_their_head(tmp_path, capsys):
    """``otzoo train PRESET --config best.json`` (``otzoo tune``'s configuration) trains the preset with the tuned
    head (here 2 proxies per class instead of 4) and its card records ``head_overrides``; ``otzoo explain PRESET
    --weights RUN`` built the preset's own head, so the run's weights did not load (exit 2, "mpw_head/proxies has
    shape (10, 4, 64) in the model and (10, 2, 64) in the file"). The model is now built as the run built it."""
    import warnings

    import explain.plots

    preset, tuned = "resnet20_mpw_fashion_mnist", {"num_proxies": 2, "epsilon": 0.05}
    run = tmp_path / "run"
    model = zoo.load(preset, pretrained=False, **tuned)
    zoo.save_preset(model, str(run), card={"name": preset, "task": "classification", "head_overrides": tuned})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, printed, err = _main(["explain", preset, "--weights", str(run), "--kinds", "mpw", "--out",
                                    str(tmp_path / "pictures"), "--dpi", "30"], capsys)
    assert code == 0, err
    # no warning that the weights were trained without the overrides they were trained with
    assert not [w for w in caught if "without these overrides" in str(w.message)]
    assert printed.splitlines() == [f"mpw: {tmp_path / 'pictures' / 'mpw_test00000.png'}"]
    with Image.open(tmp_path / "pictures" / "mpw_test00000.png") as image:  # 2 + 2 proxies columns
        assert image.size == explain.plots.figure_pixels(2 + 2, 2, dpi=30)
    # a fine-tuning run of it keeps head_overrides under its own name: given as PRESET (built from its config.json)
    # or as --weights (built with the overrides of the card whose fine_tuned.base is the preset)
    tuned_run = tmp_path / "fine_tuned"
    zoo.save_preset(model, str(tuned_run), card={"name": f"{preset}_fine_tuned", "fine_tuned": {"base": preset},
                                                 "task": "classification", "head_overrides": tuned})
    for args in ([str(tuned_run)], [preset, "--weights", str(tuned_run)]):
        out = tmp_path / f"pictures_{len(args)}"
        code, printed, err = _main(["explain", *args, "--kinds", "mpw", "--out", str(out), "--dpi", "30"], capsys)
        assert code == 0, err
        with Image.open(out / "mpw_test00000.png") as image:
            assert image.size == explain.plots.figure_pixels(2 + 2, 2, dpi=30)


def test_a_preset_directory_is_explained_with_its_own_weights_and_its_cards_preset(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(preset_dir("resnet20_gap_fashion_mnist"), run)
    code, _, err = _main(["explain", str(run), "--weights", str(run), "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and err.endswith("--weights: a preset directory is explained with its own weights; give a "
                                      "preset name with --weights, or the directory alone.")
    card = (run / "metadata.json").read_text().replace('"name": "resnet20_gap_fashion_mnist"', '"name": "mine"')
    (run / "metadata.json").write_text(card)
    code, _, err = _main(["explain", str(run), "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and f"PRESET: the card of {str(run)!r}: it names no built-in preset (name 'mine')" in err, err
    assert len(err.splitlines()) == 1 and not os.path.exists(tmp_path / "x")


@pytest.mark.fashion_mnist
def test_a_kind_named_twice_is_drawn_and_printed_once(tmp_path, capsys, monkeypatch):
    """``--kinds mpw mpw`` drew the same file twice and printed it twice; repeated kinds are dropped, keeping the
    order in which they first appear."""
    import explain.plots

    drawn, original = [], explain.plots.plot_mpw_plans

    def recording(model, image, path, **kwargs):
        drawn.append(path)
        return original(model, image, path, **kwargs)

    monkeypatch.setattr(explain.plots, "plot_mpw_plans", recording)
    out = tmp_path / "pictures"
    code, printed, err = _main(["explain", "resnet20_mpw_fashion_mnist", "--test-index", "0", "--kinds", "mpw",
                                "curves", "mpw", "--out", str(out), "--dpi", "40"], capsys)
    assert code == 0, err
    assert printed.splitlines() == [f"mpw: {out}/mpw_test00000.png", f"curves: {out}/curves.png"]
    assert drawn == [f"{out}/mpw_test00000.png"]
