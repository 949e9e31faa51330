"""The ``otzoo`` command line: every command listed, bad input as one line naming the option, exit status 2."""
import os
import re
import subprocess
import sys
from unittest import mock

import pytest

from otzoo import cli


def _run(*args):
    return subprocess.run([sys.executable, "-m", "otzoo", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_command():
    result = _run("--help")
    assert result.returncode == 0
    for command in ("list", "train", "evaluate", "fine-tune", "demo", "export", "explain"):
        assert re.search(rf"\n    {command}\s", result.stdout), command


@pytest.mark.parametrize("args, option", [
    (["train", "resnet99"], "argument preset: unknown preset 'resnet99'"),
    (["train", "resnet20_gap_fashion_mnist", "--epochs", "0"], "argument --epochs: must be an integer >= 1"),
    (["train", "resnet20_gap_fashion_mnist", "--limit", "-3"], "argument --limit: must be an integer >= 1"),
    (["evaluate", "resnet20_gap_fashion_mnist", "--weights", "/nonexistent/w.weights.h5"], "no weights file"),
    (["demo", "--limit", "zero"], "argument --limit: must be an integer >= 1"),
    (["train", "resnet20_gap_fashion_mnist", "--episodes", "3"], "--episodes applies to few-shot presets only"),
    (["train", "resnet20_emd_fewshot_fashion_mnist", "--pretrained", "/nonexistent", "--out", "OUT"],
     "`pretrained`: no pre-trained backbone"),
    pytest.param(["train", "resnet20_gsp_retrieval_fashion_mnist", "--limit", "100", "--out", "OUT"],
                 "holds 56 images, fewer than one training batch of 128", marks=pytest.mark.fashion_mnist),
])
def test_bad_input_is_one_line_and_exit_2(args, option, capsys, tmp_path):
    args = [str(tmp_path / "run") if arg == "OUT" else arg for arg in args]
    with pytest.raises(SystemExit) as exit_info:
        status = cli.main(args)
        raise SystemExit(status)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert option in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_list_prints_every_preset(capsys):
    import zoo

    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in zoo.list_models():
        assert name in out


@pytest.mark.fashion_mnist
def test_fine_tune_writes_a_preset_directory_that_loads_and_exports(tmp_path, capsys):
    """`otzoo fine-tune` fits the pretrained GAP preset on a slice; the directory it writes loads with zoo.load to
    the same predictions as the fitted model, which moved away from the pretrained weights. The batches keep their
    own seeded order: Keras is not asked to shuffle them (it warns that it cannot shuffle a tf.data.Dataset)."""
    import json
    import datetime
    import os
    import warnings

    import numpy as np

    import zoo
    from training.data.fashion_mnist import load_fashion_mnist

    out = str(tmp_path / "tuned")
    today = datetime.date.today().isoformat()  # the card's date: this day, or the next one after midnight
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["fine-tune", "resnet20_gap_fashion_mnist", "--limit", "300", "--learning-rate", "0.05",
                         "--out", out]) == 0, capsys.readouterr().err
    assert not [w for w in caught if "shuffle" in str(w.message)]
    printed = capsys.readouterr().out
    # the images fitted, not --limit's: the incomplete last batch is dropped (it said "the first 300")
    assert ("fine-tuned 1 epoch(s) on 256 of the first 300 training images (the last 44, an incomplete batch of 128, "
            "dropped) with the tensorflow backend") in printed and "saved to" in printed
    with open(os.path.join(out, "metadata.json")) as handle:
        card = json.load(handle)
    assert card["fine_tuned"]["base"] == "resnet20_gap_fashion_mnist" and card["metrics"] is None
    # The card's run fields are this run's (the command repeats it); the base preset's are kept beside them.
    base = zoo.model_card("resnet20_gap_fashion_mnist")
    assert card["command"] == (f"otzoo fine-tune resnet20_gap_fashion_mnist --out {out} --epochs 1 --limit 300 "
                               "--learning-rate 0.05 --seed 0")
    assert card["fine_tuned"]["fitted"] == "256 of the first 300 training images (the last 44, an incomplete batch " \
                                           "of 128, dropped)"
    assert card["backend"] == "tensorflow" and card["date"] in (today, datetime.date.today().isoformat())
    assert card["fine_tuned"]["base_run"]["command"] == base["command"] != card["command"]
    assert card["fine_tuned"]["base_run"]["metrics"] == base["metrics"]
    assert card["recipe"] == base["recipe"] and card["task"] == base["task"]
    tuned, pretrained = zoo.load(out), zoo.load("resnet20_gap_fashion_mnist")
    x, _ = load_fashion_mnist("test", limit=32, normalize=False)
    assert np.abs(np.asarray(tuned(x)) - np.asarray(pretrained(x))).max() > 1e-3
    again = zoo.load(out)
    np.testing.assert_array_equal(np.asarray(again(x)), np.asarray(tuned(x)))


def test_train_refuses_an_unfinished_run_without_resume(tmp_path, capsys):
    (tmp_path / "backup").mkdir()
    (tmp_path / "backup" / "checkpoint").write_text("")
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "(backup); pass --resume" in err and len(err.splitlines()) == 1
    # A few-shot run's state besides backup/ (gone once pre-training ends): it was resumed without --resume.
    few_shot = tmp_path / "few_shot"
    (few_shot / "meta_checkpoints").mkdir(parents=True)
    (few_shot / "meta_checkpoints" / "episode.json").write_text("{}")
    (few_shot / "pretrained_backbone.weights.h5").write_text("")
    assert cli.main(["train", "resnet20_emd_fewshot_fashion_mnist", "--out", str(few_shot)]) == 2
    err = capsys.readouterr().err.strip()
    assert "(pretrained_backbone.weights.h5, meta_checkpoints); pass --resume" in err, err
    # A finished few-shot run keeps that state beside its card: --resume would train nothing and rewrite the card.
    (few_shot / "metadata.json").write_text("{}")
    assert cli.main(["train", "resnet20_emd_fewshot_fashion_mnist", "--out", str(few_shot), "--resume"]) == 2
    assert "holds a finished run (metadata.json, and its pretrained_backbone" in capsys.readouterr().err


def _card_of_a_run(calls):
    """A stand-in for ``train_preset`` that records its calls and returns a card without training."""
    def train_preset(name, out, **options):
        calls.append(dict(options, name=name, out=out))
        return {"metrics": {"accuracy": 0.5}, "train_time_s": 1.0}
    return train_preset


def test_train_resume_with_nothing_to_resume_says_so_and_trains_from_scratch(tmp_path, capsys, monkeypatch):
    """``--resume`` into a directory with no training state (a first run, a mistyped --out) trained from scratch
    without a word. It still trains (the same command starts a run and restarts it after a kill), after one line on
    stderr naming the directory; with state there, or without --resume, no such line."""
    calls = []
    monkeypatch.setattr(cli, "train_preset", _card_of_a_run(calls))
    out = tmp_path / "run"
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err.strip()
    assert err == (f"otzoo train: --resume: no training state in {out} to resume from; training from scratch"), err
    assert len(calls) == 1
    (out / "backup").mkdir(parents=True)  # an empty backup folder holds nothing to resume either
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--out", str(out), "--resume"]) == 0
    assert "no training state" in capsys.readouterr().err
    (out / "backup" / "checkpoint").write_text("")
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--out", str(out), "--resume"]) == 0
    assert capsys.readouterr().err == ""
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--out", str(tmp_path / "new")]) == 0
    assert capsys.readouterr().err == ""
    assert len(calls) == 4


def test_local_workers_say_once_that_there_is_nothing_to_resume(tmp_path, capsys, monkeypatch):
    """``--workers N --resume``: the launcher says it, once; its workers, which always resume (a relaunch after a
    failure continues from the backup), say nothing, with --resume of theirs or not."""
    from training.distributed.launch import WorkerResult

    log = tmp_path / "worker.log"
    log.write_text("trained\n")
    launched = []
    monkeypatch.setattr(cli, "run_cluster", lambda command, *args, **kwargs: launched.append((command, kwargs))
                        or [[WorkerResult(0, 0, False, str(log)), WorkerResult(1, 0, False, str(log))]])
    out = tmp_path / "run"
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--workers", "2", "--out", str(out), "--resume"]) == 0
    assert capsys.readouterr().err.count("--resume: no training state") == 1
    (command, kwargs), = launched
    calls = []
    monkeypatch.setattr(cli, "train_preset", _card_of_a_run(calls))
    monkeypatch.setenv(cli.COMMAND_ENV, kwargs["env"][cli.COMMAND_ENV])  # as a worker sees it
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--out", str(out), "--resume"]) == 0
    assert capsys.readouterr().err == "" and len(calls) == 1


def test_the_card_records_the_command_that_repeats_the_run(tmp_path, capsys, monkeypatch):
    """The card's ``command`` left out --out and --workers: it now holds the options given, --out always (the
    default one too), --workers and --strategy when not their defaults, never --resume; the workers of ``--workers
    N`` record the launcher's command, not their own relaunch (--strategy multi_worker --resume)."""
    from training.distributed.launch import WorkerResult
    from training.recipes import classification

    calls = []
    monkeypatch.setattr(cli, "train_preset", _card_of_a_run(calls))
    out = tmp_path / "my run"
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--epochs", "2", "--limit", "256", "--out", str(out),
                     "--strategy", "one_device", "--resume", "--recipe", "optimizer=adam"]) == 0
    assert calls[-1]["command"] == ("otzoo train resnet20_gap_fashion_mnist --out " + f"'{out}'" + " --epochs 2 "
                                    "--limit 256 --strategy one_device --recipe 'optimizer=\"adam\"'")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--seed", "3"]) == 0
    assert calls[-1]["command"] == ("otzoo train resnet20_gap_fashion_mnist --out "
                                    f"{os.path.join('otzoo_runs', 'resnet20_gap_fashion_mnist')} --seed 3")

    launched = []
    monkeypatch.setattr(cli, "run_cluster", lambda command, *args, **kwargs: launched.append((command, kwargs))
                        or [[WorkerResult(0, 0, False, os.devnull), WorkerResult(1, 0, False, os.devnull)]])
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--limit", "256", "--workers", "2", "--out", "w"]) == 0
    (command, kwargs), = launched
    recorded = "otzoo train resnet20_gap_fashion_mnist --out w --limit 256 --workers 2"
    assert kwargs["env"][cli.COMMAND_ENV] == recorded and command[-5:] == ["--strategy", "multi_worker", "--out",
                                                                           "w", "--resume"]
    monkeypatch.setenv(cli.COMMAND_ENV, recorded)  # the chief, started with the relaunch's options
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--limit", "256", "--out", "w", "--resume"]) == 0
    assert calls[-1]["command"] == recorded
    monkeypatch.delenv(cli.COMMAND_ENV)

    # The recipe writes the command it is given on the card; called from Python, the one of its arguments.
    written = []
    monkeypatch.setattr(classification, "training_setup", lambda *args, **kwargs: mock.MagicMock())
    monkeypatch.setattr(classification, "claim_run_directory", lambda *args, **kwargs: None)
    monkeypatch.setattr(classification, "fit", lambda *args, **kwargs: None)
    monkeypatch.setattr(classification, "standard_callbacks", lambda *args, **kwargs: [])
    monkeypatch.setattr(classification, "classification_accuracy", lambda *args, **kwargs: 0.5)
    monkeypatch.setattr(classification, "write_preset", lambda *args, **kwargs: written.append(args[7]))
    classification.train("resnet20_gap_fashion_mnist", "run", epochs=2, command="otzoo train given")
    classification.train("resnet20_gap_fashion_mnist", "run", epochs=2)
    assert written == ["otzoo train given", "otzoo train resnet20_gap_fashion_mnist --out run --epochs 2"]


def test_a_preset_name_that_is_also_a_directory_here_is_refused_as_ambiguous(tmp_path, capsys, monkeypatch):
    """``otzoo fine-tune P --out P`` leaves a folder named like the preset: ``otzoo evaluate P`` or ``export P`` there
    read the packaged preset without a word. Both refuse the bare name and say how to name either; ``./P`` is the
    directory."""
    from otzoo.arguments import preset_or_directory

    preset = "resnet20_gap_fashion_mnist"
    monkeypatch.chdir(tmp_path)
    (tmp_path / preset).mkdir()
    (tmp_path / preset / "metadata.json").write_text("{}")
    expected = (f"'{preset}' is both a built-in preset and a preset directory here: write ./{preset} for the "
                "directory, or run from another folder for the preset")
    for command in (["evaluate", preset], ["export", preset, "--out", "exported"]):
        with pytest.raises(SystemExit) as exit_info:  # argparse's own errors exit; the others are returned
            raise SystemExit(cli.main(command))
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and expected in err and len(err.splitlines()) == 1, err
    assert preset_or_directory(f"./{preset}") == f"./{preset}"
    assert not (tmp_path / "exported").exists()


def test_train_refuses_the_directory_of_a_finished_run(tmp_path, capsys, monkeypatch):
    """A finished classification run leaves its card, weights and log and no training state: training into it again
    (with --resume or not) would replace the weights and card and append a second run's rows to the log."""
    monkeypatch.setattr(cli, "train_preset", lambda *args, **kwargs: pytest.fail("the run was not refused"))
    files = {"metadata.json": '{"name": "resnet20_gap_fashion_mnist"}', "model.weights.h5": "weights",
             "log.csv": "epoch,loss\n0,1.0\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    for resume in ([], ["--resume"]):
        assert cli.main(["train", "resnet20_gap_fashion_mnist", "--out", str(tmp_path), *resume]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"--out {tmp_path} holds a finished run (metadata.json); choose another --out, or delete "
                            "the directory to train again."), err
        assert len(err.splitlines()) == 1
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == files  # nothing changed


def test_local_workers_report_the_attempt_whose_chief_finished(tmp_path, capsys, monkeypatch):
    """A worker that fails after the chief wrote the card has its attempt relaunched, and the relaunch refuses the
    finished run's --out (exit status 2): the run's result is the attempt that finished, not that refusal."""
    from training.distributed.launch import WorkerResult

    logs = {}
    for name, text in (("ok", "trained\n"), ("crash", "Segmentation fault\n"),
                       ("refused", f"otzoo train: error: --out {tmp_path} holds a finished run (metadata.json)\n")):
        logs[name] = str(tmp_path / f"{name}.log")
        with open(logs[name], "w") as handle:
            handle.write(text)
    attempts = [[WorkerResult(0, 0, False, logs["ok"]), WorkerResult(1, -11, False, logs["crash"])],
                [WorkerResult(0, 2, False, logs["refused"]), WorkerResult(1, 2, False, logs["refused"])]]
    monkeypatch.setattr(cli, "run_cluster", lambda *args, **kwargs: attempts)
    status = cli.main(["train", "resnet20_gap_fashion_mnist", "--workers", "2", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert status == 1 and f"worker(s) 1 failed (exit status -11); see {logs['crash']}" in err, err
    assert "finished run" not in err
    attempts[0][1] = WorkerResult(1, 0, False, logs["ok"])  # every worker of the first attempt finished
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--workers", "2", "--out", str(tmp_path / "run")]) == 0


def test_a_killed_run_in_a_reused_directory_resumes_beside_the_earlier_card(tmp_path, monkeypatch):
    """A card beside backup/ is an unfinished run's (a classification run started into a preset directory by
    ``train_preset`` or an earlier otzoo, and killed): --resume goes on (only a few-shot run keeps its state beside
    its card when it finishes)."""
    (tmp_path / "metadata.json").write_text("{}")
    (tmp_path / "backup").mkdir()
    (tmp_path / "backup" / "checkpoint").write_text("")

    def reached(*args, **kwargs):
        raise KeyboardInterrupt  # past the command's checks: where training would start

    monkeypatch.setattr(cli, "train_preset", reached)
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--out", str(tmp_path), "--resume"]) == 130


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_train_multi_worker_on_two_local_workers(tmp_path, capsys, monkeypatch):
    """`otzoo train --workers 2`: two processes train with MultiWorkerMirroredStrategy; the chief's epochs show up
    on this process's stdout while it trains; the chief writes the preset into --out and nothing else of a worker
    stays there (the other worker's copy goes to a temporary folder, removed at the end, whose weights are the
    chief's); the card records the strategy."""
    import json
    import os
    import types

    import numpy as np

    from tests.resume_checks import weights_file_arrays

    scratch, removed = tmp_path / "scratch", []
    scratch.mkdir()
    monkeypatch.setattr(cli, "tempfile", types.SimpleNamespace(mkdtemp=lambda prefix: str(scratch)), raising=False)
    monkeypatch.setattr(cli, "shutil", types.SimpleNamespace(rmtree=lambda path, **kwargs: removed.append(path)), raising=False)
    out = tmp_path / "run"
    assert cli.main(["train", "resnet20_gap_fashion_mnist", "--limit", "256", "--epochs", "1", "--batch-size", "64",
                     "--workers", "2", "--out", str(out)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert re.search(r"\d+/\d+ - .*loss: \d", printed), printed  # the chief's epoch progress, streamed
    assert "trained on 2 local workers" in printed
    assert "worker-1" not in os.listdir(out) and not any(name.startswith("worker-") for name in os.listdir(out))
    assert removed == [str(scratch)]  # the non-chief's scratch folder, outside --out, removed at the end
    card = json.loads((out / "metadata.json").read_text())
    assert "multi_worker, 2 replica(s)" in card["strategy"]

    chief = weights_file_arrays(out / "model.weights.h5")
    other = weights_file_arrays(scratch / "worker-1" / "model.weights.h5")
    assert sorted(chief) == sorted(other) and len(chief) > 10
    for key in chief:
        if "batch_normalization" in key and key.endswith(("vars/2", "vars/3")):
            continue  # BatchNorm's moving statistics are each replica's own (docs/distributed.md, known limits)
        np.testing.assert_array_equal(chief[key], other[key], err_msg=key)
