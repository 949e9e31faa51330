"""The ``otzoo`` command line: every command listed, bad input as one line naming the option, exit status 2."""
import subprocess
import sys

import pytest

from training import cli


def _run(*args):
    return subprocess.run([sys.executable, "-m", "training.cli", *args], capture_output=True, text=True, timeout=300)


def test_help_lists_every_command():
    result = _run("--help")
    assert result.returncode == 0
    for command in ("list", "train", "evaluate", "demo", "export", "explain"):
        assert f"    {command} " in result.stdout


@pytest.mark.parametrize("args, option", [
    (["train", "resnet99"], "argument preset: unknown preset 'resnet99'"),
    (["train", "resnet20_gap_fashion_mnist", "--epochs", "0"], "argument --epochs: must be an integer >= 1"),
    (["train", "resnet20_gap_fashion_mnist", "--limit", "-3"], "argument --limit: must be an integer >= 1"),
    (["evaluate", "resnet20_gap_fashion_mnist", "--weights", "/nonexistent/w.weights.h5"], "no weights file"),
    (["demo", "--limit", "zero"], "argument --limit: must be an integer >= 1"),
    (["train", "resnet20_gap_fashion_mnist", "--episodes", "3"], "--episodes apply to few-shot presets only"),
    (["train", "resnet20_emd_fewshot_fashion_mnist", "--pretrained", "/nonexistent", "--out", "/tmp/otzoo-x"],
     "`pretrained`: no pre-trained backbone"),
    (["train", "resnet20_gsp_retrieval_fashion_mnist", "--limit", "100", "--out", "/tmp/otzoo-x"],
     "training images of the seen classes, fewer than one batch"),
])
def test_bad_input_is_one_line_and_exit_2(args, option, capsys):
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
