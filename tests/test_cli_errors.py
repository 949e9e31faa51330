"""What ``otzoo`` maps to one line and exit status 2 (the user's input: ``CommandError``, a data slice too small,
data not installed, argparse's errors) and what it does not (any other exception keeps its traceback), and every
``--limit`` too small for the slice a command makes."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import zoo
from otzoo import cli
from training.data.datasets import data_spec
from training.data.errors import DataUnavailableError, EmptySliceError
from training.recipes.fine_tune import fine_tune_preset
from training.tuning.search import tune
from zoo.loading import preset_dir
from zoo.registry import PRESETS


def _fails_with(args, message, capsys):
    with pytest.raises(SystemExit) as exit_info:  # argparse's own errors exit; the others are returned
        raise SystemExit(cli.main(args))
    status = exit_info.value.code
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    assert message in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _raising(error):
    def run(args):
        raise error
    return run


@pytest.mark.parametrize("error", [ValueError("internal"), FileNotFoundError("internal"), KeyError("loss")])
def test_an_internal_error_is_not_a_user_error(error, monkeypatch, capsys):
    """A ValueError or FileNotFoundError raised inside a command (e.g. deep in TensorFlow) is a bug: it leaves
    main with its traceback instead of becoming a one-line "user error" with exit status 2."""
    monkeypatch.setattr(cli, "list_presets", _raising(error))
    with pytest.raises(type(error), match="internal|loss"):
        cli.main(["list"])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("error, message", [
    (cli.CommandError("--limit 5: too few"), "otzoo list: error: --limit 5: too few"),
    (EmptySliceError("3 images, fewer than one batch", "limit", 3), "error: --limit 3: 3 images, fewer than one"),
    (EmptySliceError("no example held out"), "otzoo list: error: no example held out"),
    (DataUnavailableError("Fashion-MNIST IDX files not found"), "error: Fashion-MNIST IDX files not found"),
])
def test_user_errors_are_one_line_and_exit_2(error, message, monkeypatch, capsys):
    monkeypatch.setattr(cli, "list_presets", _raising(error))
    _fails_with(["list"], message, capsys)


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    """Ctrl-C stops a command with one line (how to continue, for a run that resumes) and the shell's 130."""
    monkeypatch.setattr(cli, "list_presets", _raising(KeyboardInterrupt()))
    assert cli.main(["list"]) == 130
    assert capsys.readouterr().err.strip() == "otzoo list: interrupted"
    monkeypatch.setattr(cli, "train", _raising(KeyboardInterrupt()))
    assert cli.main(["train", "resnet20_gap_fashion_mnist"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("otzoo train: interrupted; the same command with --resume")


def test_console_script_exits_1_with_the_traceback_of_an_internal_error():
    code = ("import sys\nfrom otzoo import cli\n"
            "def boom(args):\n    raise ValueError('internal')\n"
            "cli.list_presets = boom\nsys.exit(cli.main(['list']))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "Traceback" in result.stderr and "ValueError: internal" in result.stderr


def test_the_empty_slice_error_names_the_option():
    error = EmptySliceError("5 training images, fewer than one batch of 128", "batch_size", 128)
    assert isinstance(error, ValueError)
    assert str(error) == "`batch_size` 128: 5 training images, fewer than one batch of 128"
    assert error.option_message() == "--batch-size 128: 5 training images, fewer than one batch of 128"


def test_missing_weights_and_files_are_one_line(tmp_path, capsys):
    _fails_with(["evaluate", "resnet20_gap_fashion_mnist", "--weights", str(tmp_path / "w.weights.h5")],
                "argument --weights: no weights file at", capsys)
    _fails_with(["explain", "resnet20_gap_fashion_mnist", "--weights", str(tmp_path), "--out", str(tmp_path)],
                "argument --weights: no weights file at", capsys)
    _fails_with(["export", str(tmp_path / "none.keras"), "--out", str(tmp_path / "out")],
                "NAME_OR_PATH: no .keras file at", capsys)


def test_export_names_an_output_it_cannot_write_and_a_directory_without_a_preset(tmp_path, capsys):
    """Both were tracebacks: the ONNX one only after the model had been converted."""
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "resnet20_gap_fashion_mnist").write_text("")
    (tmp_path / "p" / "resnet20_gap_fashion_mnist.onnx").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    _fails_with(["export", "resnet20_gap_fashion_mnist", "--out", str(tmp_path / "o"), "--no-verify"],
                "--out: '" + str(tmp_path / "o" / "resnet20_gap_fashion_mnist") + "' is a file", capsys)
    _fails_with(["export", "resnet20_gap_fashion_mnist", "--out", str(tmp_path / "p"), "--format", "onnx",
                 "--no-verify"], "resnet20_gap_fashion_mnist.onnx' is a directory", capsys)
    _fails_with(["export", str(tmp_path / "empty"), "--out", str(tmp_path / "q"), "--no-verify"],
                "NAME_OR_PATH: the directory '" + str(tmp_path / "empty") + "' holds no preset", capsys)
    _fails_with(["export", "resnet20_gap_fashion_mnist", "--out", str(tmp_path / "q"), "--no-verify", "--task",
                 "few_shot"], "--task: ", capsys)
    assert not (tmp_path / "q").exists()


def test_abbreviated_options_are_refused(capsys):
    """``--work 2`` was taken for ``--workers 2``, and the relaunched workers kept it (each started more)."""
    _fails_with(["train", "resnet20_gap_fashion_mnist", "--work", "2", "--out", "x"], "unrecognized arguments: --work",
                capsys)


@pytest.mark.parametrize("recipe", [["optimizer", "adam"], ["=adam"]])
def test_a_recipe_option_without_field_and_value_names_recipe(recipe, tmp_path, capsys):
    """``--recipe optimizer adam`` ended in "otzoo: error: unrecognized arguments: adam", naming neither the command
    nor the option."""
    out = tmp_path / "run"
    _fails_with(["train", "resnet20_gap_fashion_mnist", "--out", str(out), "--recipe", *recipe],
                f"otzoo train: error: argument --recipe: expected FIELD=VALUE (e.g. optimizer=adam, no spaces around "
                f"=), got {recipe[0]!r}", capsys)
    assert not out.exists()


def test_a_cluster_that_cannot_start_and_an_old_meta_checkpoint_are_one_line(tmp_path, capsys, monkeypatch):
    """Tracebacks before: --strategy multi_worker without TF_CONFIG, a malformed TF_CONFIG, and (after pre-training
    had been resumed) a tf.train meta-training checkpoint of an earlier otzoo."""
    out = str(tmp_path / "run")
    monkeypatch.delenv("TF_CONFIG", raising=False)
    _fails_with(["train", "resnet20_gap_fashion_mnist", "--strategy", "multi_worker", "--out", out],
                "--strategy multi_worker: needs the TF_CONFIG environment variable", capsys)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    _fails_with(["train", "resnet20_gap_fashion_mnist", "--out", out], "`TF_CONFIG` is not valid JSON", capsys)
    monkeypatch.delenv("TF_CONFIG")
    old = tmp_path / "few_shot" / "meta_checkpoints"
    old.mkdir(parents=True)
    (old / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"')
    _fails_with(["train", "resnet20_emd_fewshot_fashion_mnist", "--out", str(old.parent), "--resume"],
                "--out: `checkpoint_dir` '" + str(old) + "' holds a tf.train checkpoint", capsys)
    assert not os.path.exists(out)


@pytest.mark.parametrize("strategy", ["mirrored", "one_device"])
def test_workers_with_another_strategy_than_multi_worker_is_one_line(strategy, tmp_path, capsys, monkeypatch):
    """``--workers 2 --strategy mirrored`` dropped --strategy without a word: the workers run multi_worker."""
    def no_cluster(*args, **kwargs):
        raise AssertionError("workers were launched")

    monkeypatch.setattr(cli, "run_cluster", no_cluster)
    out = tmp_path / "run"
    _fails_with(["train", "resnet20_gap_fashion_mnist", "--workers", "2", "--strategy", strategy, "--out", str(out)],
                f"otzoo train: error: --strategy {strategy}: --workers 2 trains under multi_worker (every worker's "
                "strategy); leave --strategy out, or give --strategy multi_worker.", capsys)
    assert not out.exists()


def _preset_copy(tmp_path, name, **card_changes):
    """A copy of the packaged preset ``name`` whose card has ``card_changes`` (``None``: the field removed)."""
    copy = tmp_path / name
    shutil.copytree(preset_dir("resnet20_mpw_fashion_mnist"), copy)
    card = json.loads((copy / "metadata.json").read_text())
    card.update(card_changes)
    (copy / "metadata.json").write_text(json.dumps({k: v for k, v in card.items() if v is not None}))
    return copy


def test_evaluate_names_a_card_it_cannot_read(tmp_path, capsys):
    """Each was a traceback (KeyError, ValueError from the data set's spec, UnicodeDecodeError)."""
    for name, changes, message in [("no_dataset", {"dataset": None}, "the card states no `dataset`"),
                                   ("other_dataset", {"dataset": "nosuch"}, "`dataset` must be one of"),
                                   ("zero_shape", {"input_shape": [0, 0, 1]}, "PRESET: the card of"),
                                   ("int_shape", {"input_shape": 28}, "`input_shape` must be [height, width, "),
                                   ("list_dataset", {"dataset": ["a"]}, "the card states no `dataset`")]:
        _fails_with(["evaluate", str(_preset_copy(tmp_path, name, **changes))], message, capsys)
    binary = _preset_copy(tmp_path, "binary")
    (binary / "metadata.json").write_bytes(b"\xff\xfe{}")
    _fails_with(["evaluate", str(binary)], "is not valid JSON", capsys)


def test_export_takes_a_preset_directory_of_ones_own_model_and_one_named_like_a_keras_file(tmp_path, capsys):
    """zoo.save_preset writes no data set (KeyError) and may state task generic (refused even with --no-verify); a
    preset directory named m.keras was looked for as a .keras file."""
    model = zoo.image_classifier("small_convnet", "gap_fc", 10, input_shape=(28, 28, 1),
                                 backbone_kwargs={"width": 4, "feature_dim": 8})
    zoo.save_preset(model, str(tmp_path / "own"))
    shutil.copytree(preset_dir("resnet20_gap_fashion_mnist"), tmp_path / "m.keras")
    for source in ("own", "m.keras"):
        assert cli.main(["export", str(tmp_path / source), "--out", str(tmp_path / "out"), "--format", "saved_model",
                         "--no-verify"]) == 0
    capsys.readouterr()


def test_demo_names_an_output_it_cannot_write_before_its_work(tmp_path, capsys, monkeypatch):
    """--out holding a file named saved_model failed after loading, evaluating and fine-tuning."""
    (tmp_path / "saved_model").write_text("")
    monkeypatch.setattr(cli.zoo, "load", lambda *a, **k: pytest.fail("the demo started its work"))
    _fails_with(["demo", "--out", str(tmp_path)], "--out: '" + str(tmp_path / "saved_model") + "' is a file", capsys)


def test_data_dir_for_a_fashion_mnist_preset_is_refused_not_ignored(tmp_path, capsys):
    for command in (["evaluate", "resnet20_gap_fashion_mnist"],
                    ["train", "resnet20_gap_fashion_mnist", "--out", str(tmp_path / "run")]):
        _fails_with(command + ["--data-dir", str(tmp_path)], "--data-dir: applies to TFDS data sets", capsys)
    assert not (tmp_path / "run").exists()
    # a preset directory is judged by its own card's data set: a CIFAR-100 run takes --data-dir (and then fails on
    # its missing weights, a later check)
    run = tmp_path / "gsp_c100"
    run.mkdir()
    (run / "metadata.json").write_text(json.dumps({"name": "resnet20_gsp_retrieval_fashion_mnist", "task": "retrieval",
                                                   "dataset": "cifar100"}))
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(cli.main(["evaluate", str(run), "--data-dir", str(tmp_path)]))
    assert "--data-dir" not in capsys.readouterr().err and exit_info.value.code != 0


def test_tune_refuses_presets_whose_trials_cannot_run(capsys):
    _fails_with(["tune", "resnet20_emd_fewshot_fashion_mnist", "--out", "unused"],
                "preset: resnet20_emd_fewshot_fashion_mnist is a few_shot preset", capsys)


@pytest.fixture
def gap_on_cifar10(monkeypatch):
    """The GAP preset re-targeted at CIFAR-10 (no built-in preset trains on another data set yet)."""
    name = "resnet20_gap_fashion_mnist"
    monkeypatch.setitem(PRESETS, name, PRESETS[name].with_data(data_spec("cifar10", "classification")))
    return name


@pytest.mark.parametrize("command, what", [("fine-tune", "fine-tuning"), ("tune", "tuning")])
def test_fine_tune_and_tune_refuse_a_preset_of_another_data_set(command, what, gap_on_cifar10, tmp_path, capsys):
    """Both read Fashion-MNIST only: a preset trained on another data set is one line, not a traceback."""
    out = tmp_path / "out"
    argument = "PRESET" if command == "fine-tune" else "preset"  # fine-tune takes a preset directory too
    _fails_with([command, gap_on_cifar10, "--out", str(out)],
                f"{argument}: {gap_on_cifar10} trains on cifar10; {what} reads Fashion-MNIST only", capsys)
    assert not os.path.exists(out)


def test_the_library_refuses_a_preset_of_another_data_set(gap_on_cifar10, tmp_path):
    with pytest.raises(ValueError, match="trains on cifar10; fine-tuning reads Fashion-MNIST only"):
        fine_tune_preset(gap_on_cifar10, str(tmp_path / "out"))
    with pytest.raises(ValueError, match="tuning reads Fashion-MNIST only, not 'cifar10'"):
        tune(gap_on_cifar10, 1, str(tmp_path / "tune"))
    assert not os.listdir(tmp_path)


def test_demo_needs_one_batch_to_fine_tune(tmp_path, capsys):
    _fails_with(["demo", "--limit", "5", "--out", str(tmp_path / "demo")], "--limit 5: fewer than one batch of 128",
                capsys)
    assert not os.path.exists(tmp_path / "demo")


@pytest.mark.fashion_mnist
@pytest.mark.parametrize("preset, limit, message", [
    ("resnet20_mpw_fashion_mnist", 5, "--limit 5: 5 training images, fewer than one batch of 128"),
    ("resnet20_gsp_retrieval_fashion_mnist", 200, "--limit 200: 1"),  # about half are of the seen classes
    ("resnet20_emd_fewshot_fashion_mnist", 60, "base class(es) with 16 images or more; a 5-way episode needs 5"),
])
def test_fine_tune_on_a_too_small_slice_is_one_line(preset, limit, message, tmp_path, capsys):
    """Before: `KeyError: 'loss'` (an empty data set, model.fit returns no loss) or a ValueError traceback."""
    out = tmp_path / "tuned"
    err = _fails_with(["fine-tune", preset, "--limit", str(limit), "--out", str(out)], message, capsys)
    assert f"--limit {limit}:" in err
    assert not os.path.exists(out)


@pytest.mark.fashion_mnist
@pytest.mark.parametrize("preset, limit, message", [
    ("resnet20_gsp_retrieval_fashion_mnist", 3, "retrieval metrics need two images or more of each class"),
    ("resnet20_emd_fewshot_fashion_mnist", 100, "5-way 5-shot episodes with 15 queries need 5 classes of 20"),
])
def test_evaluate_on_a_too_small_slice_is_one_line(preset, limit, message, capsys):
    err = _fails_with(["evaluate", preset, "--limit", str(limit)], message, capsys)
    assert f"--limit {limit}: the first {limit} test images hold" in err


@pytest.mark.fashion_mnist
@pytest.mark.parametrize("preset, limit, message", [
    ("resnet20_mpw_fashion_mnist", 1, "--validation-fraction 0.2 of 1 examples holds out no example"),
    ("resnet20_mpw_fashion_mnist", 50, "training examples left after the validation split, fewer than one batch"),
    ("resnet20_gsp_retrieval_fashion_mnist", 1, "leaves fewer than two to train on"),
])
def test_tune_on_a_too_small_slice_is_one_line(preset, limit, message, tmp_path, capsys):
    err = _fails_with(["tune", preset, "--limit", str(limit), "--trials", "1", "--out", str(tmp_path / "t")], message,
                      capsys)
    assert err.startswith(f"otzoo tune: error: --limit {limit}:")


def test_a_backend_chosen_too_late_is_named(capsys):
    """In a process where Keras already runs on TensorFlow, ``--backend jax`` cannot take effect: one line."""
    _fails_with(["--backend", "jax", "list"], "backend: Keras already runs on tensorflow", capsys)


@pytest.mark.parametrize("command, expected", [
    (["export", "resnet20_mpw_fashion_mnist", "--out", "unused"], "backend: otzoo export runs on the TensorFlow backend"),
    (["train", "resnet20_mpw_fashion_mnist", "--limit", "8", "--workers", "2"], "--workers: multi-worker"),
    (["train", "resnet20_mpw_fashion_mnist", "--limit", "8", "--strategy", "mirrored"], "--strategy: multi-worker"),
])
def test_tensorflow_only_parts_refuse_other_backends(command, expected, tmp_path):
    """``otzoo --backend jax`` (the backend picked on the command line, before Keras is imported) with a part that
    runs on TensorFlow only (export, multi-worker or tf.distribute training) ends in one
    line naming the option and the backend, before anything is written."""
    pytest.importorskip("jax")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("KERAS_BACKEND", None)
    proc = subprocess.run([sys.executable, "-m", "otzoo", "--backend", "jax", *command], capture_output=True,
                          text=True, env=env, cwd=str(tmp_path))
    lines = [line for line in proc.stderr.splitlines() if line.startswith("otzoo")]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert lines and expected in lines[-1] and "jax" in lines[-1], lines
    assert "Traceback" not in proc.stderr and os.listdir(tmp_path) == []


WITHOUT_TENSORFLOW = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backends", "without_tensorflow_site")


def _otzoo_without_tensorflow(args, keras_home, **environment):
    """``python -m otzoo ARGS`` in a process where ``import tensorflow`` fails, as on a machine without it."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=WITHOUT_TENSORFLOW, KERAS_HOME=str(keras_home),
               **environment)
    if "KERAS_BACKEND" not in environment:
        env.pop("KERAS_BACKEND", None)
    return subprocess.run([sys.executable, "-m", "otzoo", *args], capture_output=True, text=True, env=env,
                          cwd=str(keras_home), timeout=300)


def test_a_backend_whose_library_is_missing_is_one_line(tmp_path):
    """Without TensorFlow and with no backend chosen, Keras would run on TensorFlow and fail deep in its import: the
    command says so in one line naming ``backend``, where the choice came from and the backends installed."""
    pytest.importorskip("jax")
    proc = _otzoo_without_tensorflow(["list"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [
        f"otzoo: error: backend: Keras runs on tensorflow (Keras' default), which is not installed: run otzoo "
        f"--backend jax ... ({', '.join(b for b in ('jax', 'torch') if importlib.util.find_spec(b))} installed "
        f"here), or pip install tensorflow"], proc.stderr
    (tmp_path / "keras.json").write_text('{"backend": "tensorflow", "floatx": "float32"}')
    proc = _otzoo_without_tensorflow(["list"], tmp_path)
    assert proc.returncode == 2 and "(Keras' default)" not in proc.stderr
    assert f"tensorflow ({tmp_path / 'keras.json'})" in proc.stderr, proc.stderr
    proc = _otzoo_without_tensorflow(["list"], tmp_path, KERAS_BACKEND="tensorflow")
    assert proc.returncode == 2 and "tensorflow (KERAS_BACKEND)" in proc.stderr, proc.stderr
    proc = _otzoo_without_tensorflow(["--backend", "jax", "list"], tmp_path)
    assert proc.returncode == 0 and "resnet20_mpw_fashion_mnist" in proc.stdout, proc.stderr[-2000:]


_TENSORBOARD_WITHOUT_TENSORFLOW = (
    "--tensorboard (Keras writes TensorBoard logs with tf.summary) needs tensorflow, which is not installed here: pip "
    "install tensorflow, or train without --tensorboard (log.csv in the run's directory holds every epoch's metrics "
    "and the layers' signals)")
_TFDS_WITHOUT_TENSORFLOW = (
    "`dataset` 'cifar10' (a TFDS data set, read through tf.data on every backend) needs tensorflow, which is not "
    "installed here: pip install tensorflow, or use a data set read in memory (fashion_mnist)")


@pytest.mark.parametrize("preset, options, message", [
    ("resnet20_gap_fashion_mnist", ["--tensorboard", "logs"], _TENSORBOARD_WITHOUT_TENSORFLOW),
    ("resnet20_protonet_fewshot_fashion_mnist", ["--tensorboard", "logs"], _TENSORBOARD_WITHOUT_TENSORFLOW),
    ("resnet20_gap_fashion_mnist", ["--dataset", "cifar10"], _TFDS_WITHOUT_TENSORFLOW),
    ("resnet20_protonet_fewshot_fashion_mnist", ["--dataset", "cifar10"], _TFDS_WITHOUT_TENSORFLOW),
])
def test_parts_that_need_tensorflow_on_every_backend_are_one_line_without_it(preset, options, message, tmp_path):
    """``otzoo --backend jax train`` on a machine without TensorFlow, with a part that needs it on every backend
    (Keras' TensorBoard callback writes with ``tf.summary``; the TFDS data sets are ``tf.data`` pipelines): one line
    naming the option, exit status 2, no run directory (both failed with a traceback from inside Keras or TFDS)."""
    pytest.importorskip("jax")
    proc = _otzoo_without_tensorflow(["--backend", "jax", "train", preset, "--limit", "256", "--out", "run",
                                      *options], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [f"otzoo train: error: {message}"], proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "logs").exists()


def test_an_import_error_of_another_module_keeps_its_traceback(tmp_path):
    """Only the backend's own library is named in one line: a missing module otzoo needs (here SciPy) is a broken
    install, and its error keeps its traceback."""
    code = ("import sys\n"
            "class BlockSciPy:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.partition('.')[0] == 'scipy':\n"
            "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
            "sys.meta_path.insert(0, BlockSciPy())\n"
            "from otzoo.launch import main\n"
            "sys.exit(main(['list']))\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=300)
    assert proc.returncode == 1 and "Traceback" in proc.stderr, proc.stderr[-2000:]
    assert "No module named 'scipy" in proc.stderr and "otzoo: error" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize("field, value, message", [
    ("epochs", "0", "recipe field `epochs` must be an integer >= 1, got 0"),
    ("epochs", "abc", "recipe field `epochs` must be an integer >= 1, got 'abc'"),
    ("batch_size", "2.5", "recipe field `batch_size` must be an integer >= 1, got 2.5"),
    ("learning_rate", "-1", "recipe field `learning_rate` must be a finite number > 0, got -1"),
    ("momentum", "7", "recipe field `momentum` must be a number in [0, 1), got 7"),
    ("l2", "-5", "recipe field `l2` must be a finite number >= 0, got -5"),
    ("loss_kwargs", "3", "recipe field `loss_kwargs` must be an object of keyword arguments"),
    ("callbacks", '"gsp_init"', "recipe field `callbacks` must be a list of names"),
    ("optimizer", '{"name": "sgd"}', "recipe field `optimizer` must be a name (a JSON string)"),
    ("seed", str(2 ** 32), "recipe field `seed` must be an integer in 0 .. 2**32 - 1"),
])
def test_recipe_values_out_of_range_are_one_line_before_anything_is_written(field, value, message, tmp_path,
                                                                              capsys):
    """A count of 0 or a string failed deep in training with a traceback, and a negative learning rate trained
    (ascending the loss) and published itself in the card: each is refused, naming the field, with nothing in
    --out."""
    out = tmp_path / "run"
    err = _fails_with(["train", "resnet20_gap_fashion_mnist", "--limit", "256", "--out", str(out), "--recipe",
                       f"{field}={value}"], message, capsys)
    assert err.startswith("otzoo train: error: --recipe: recipe field"), err  # the option given, no other
    assert not out.exists()


@pytest.mark.fashion_mnist
@pytest.mark.parametrize("preset, recipe, message", [
    ("resnet20_gap_retrieval_fashion_mnist", 'loss_kwargs={"temperature": "hot", "num_proxies": 1}',
     "`loss_kwargs` {'temperature': 'hot', 'num_proxies': 1} does not fit model"),
    ("resnet20_gap_fashion_mnist", 'loss="hyperspherical_pull"', "recipe field `loss` 'hyperspherical_pull'"),
    ("resnet20_gap_fashion_mnist", 'callbacks=["GSPPrototypeInit"]', "GSPPrototypeInit drives the layer 'gsp'"),
])
def test_a_recipe_that_does_not_fit_the_model_is_one_line_before_training(preset, recipe, message, tmp_path, capsys):
    """A loss argument the loss refuses, a loss or a callback for a layer the preset's model lacks: found while the
    run is set up, they ended in tracebacks; now one line naming the recipe field, and no run directory."""
    out = tmp_path / "run"
    _fails_with(["train", preset, "--limit", "256", "--epochs", "1", "--out", str(out), "--recipe", recipe], message,
                capsys)
    assert not out.exists()


@pytest.mark.fashion_mnist
def test_a_pretrained_file_that_is_no_backbone_is_one_line_and_claims_no_run_directory(tmp_path, capsys):
    """The preset's whole-model weights given as --pretrained ended in Keras' 110-line error after run.json was
    written into --out."""
    out = tmp_path / "run"
    whole_model = os.path.join(preset_dir("resnet20_protonet_fewshot_fashion_mnist"), "model.weights.h5")
    with pytest.warns(UserWarning):  # Keras' own warning on the objects it could not load comes first
        code = cli.main(["train", "resnet20_protonet_fewshot_fashion_mnist", "--limit", "512", "--episodes", "1",
                         "--out", str(out), "--pretrained", whole_model])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err, err
    assert "`pretrained`" in err.splitlines()[-1] and "is not the pre-trained backbone" in err.splitlines()[-1]
    assert not out.exists()


def test_more_ways_than_base_classes_names_ways_not_limit(tmp_path, capsys):
    """5 base classes cannot make 20-way episodes whatever the slice: the error named --limit, which no value fixes."""
    out = tmp_path / "run"
    _fails_with(["train", "resnet20_protonet_fewshot_fashion_mnist", "--limit", "256", "--out", str(out),
                 "--recipe", "ways=20"], "recipe field `ways` must be at most the 5 base classes", capsys)
    assert not out.exists()


def test_an_unreadable_tuning_config_is_one_line(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("garbage")
    _fails_with(["train", "resnet20_mpw_fashion_mnist", "--out", str(tmp_path / "run"), "--config",
                 str(tmp_path / "bad.json")], "--config: `config`", capsys)
    _fails_with(["train", "resnet20_mpw_fashion_mnist", "--out", str(tmp_path / "run"), "--config",
                 str(tmp_path / "none.json")], "--config: `config`: no tuning result", capsys)
    (tmp_path / "inf.json").write_text('{"preset": "resnet20_mpw_fashion_mnist", "learning_rate": Infinity, '
                                       '"head_kwargs": {}}')  # Python's json writes and reads Infinity
    _fails_with(["train", "resnet20_mpw_fashion_mnist", "--out", str(tmp_path / "run"), "--config",
                 str(tmp_path / "inf.json")], "'learning_rate' (a finite number > 0)", capsys)
    # a tuned head that the preset's head does not take (it ended in a traceback after the data were read)
    (tmp_path / "head.json").write_text(json.dumps({"preset": "resnet20_mpw_fashion_mnist", "learning_rate": 0.1,
                                                    "head_kwargs": {"num_proxies": -2}}))
    _fails_with(["train", "resnet20_mpw_fashion_mnist", "--out", str(tmp_path / "run"), "--config",
                 str(tmp_path / "head.json")], "do not fit preset 'resnet20_mpw_fashion_mnist': `num_proxies`",
                capsys)
    assert not (tmp_path / "run").exists()


def test_outputs_are_checked_before_the_work(tmp_path, capsys):
    """An --out that is a file (or below one) failed after training or fine-tuning, losing the work; fine-tuning into
    a directory holding a preset (a packaged one included) replaced it without a word; a NaN or infinite learning
    rate trained NaN weights."""
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    for args in (["train", "resnet20_gap_fashion_mnist"], ["tune", "resnet20_gap_fashion_mnist"],
                 ["explain", "resnet20_gap_fashion_mnist"], ["export", "resnet20_gap_fashion_mnist"], ["demo"],
                 ["fine-tune", "resnet20_gap_fashion_mnist"]):
        _fails_with(args + ["--out", str(a_file)], f"argument --out: '{a_file}' is a file; give a directory", capsys)
        _fails_with(args + ["--out", ""], "argument --out: is empty; give a directory", capsys)  # failed after the work
    _fails_with(["fine-tune", "resnet20_gap_fashion_mnist", "--out", str(a_file / "sub")],
                f"is below the file '{a_file}'", capsys)
    packaged = preset_dir("resnet20_gap_fashion_mnist")
    before = os.path.getmtime(os.path.join(packaged, "model.weights.h5"))
    _fails_with(["fine-tune", "resnet20_gap_fashion_mnist", "--out", packaged], "holds a preset already", capsys)
    assert os.path.getmtime(os.path.join(packaged, "model.weights.h5")) == before
    for rate in ("nan", "inf", "-0.1"):
        _fails_with(["fine-tune", "resnet20_gap_fashion_mnist", "--out", str(tmp_path / "t"), "--learning-rate",
                     rate], "argument --learning-rate: must be a number > 0", capsys)
    _fails_with(["fine-tune", "resnet20_gap_fashion_mnist", "--out", str(tmp_path / "t"), "--seed", "-1"],
                "argument --seed: must be an integer >= 0", capsys)
    for args in (["train", "resnet20_gap_fashion_mnist"], ["tune", "resnet20_gap_fashion_mnist"],
                 ["fine-tune", "resnet20_gap_fashion_mnist", "--out", str(tmp_path / "t")]):
        _fails_with(args + ["--seed", str(2 ** 32)], "argument --seed: must be an integer <= 4294967295", capsys)
    with pytest.raises(ValueError, match="`out_dir`.*holds a preset already"):
        fine_tune_preset("resnet20_gap_fashion_mnist", packaged)
    with pytest.raises(ValueError, match="`learning_rate` must be a finite number > 0"):
        fine_tune_preset("resnet20_gap_fashion_mnist", str(tmp_path / "t"), learning_rate=float("nan"))
    with pytest.raises(ValueError, match="^`seed`"):  # Keras' message named no argument
        fine_tune_preset("resnet20_gap_fashion_mnist", str(tmp_path / "t"), seed=-1)
    assert not (tmp_path / "t").exists()


@pytest.mark.fashion_mnist
@pytest.mark.parametrize("command, options", [("evaluate", ["--limit", "256"]),
                                              ("explain", ["--kinds", "prototypes", "--out", "OUT"]),
                                              ("export", ["--no-verify", "--out", "OUT"]),
                                              ("fine-tune", ["--limit", "256", "--out", "OUT"])])
def test_a_built_in_preset_without_its_weights_is_one_line(command, options, tmp_path, monkeypatch, capsys):
    """A preset added to the registry but not trained yet has no weights in its package: zoo.load's error
    (MissingWeightsError, a FileNotFoundError) is the user's to fix, so each command that loads the preset ends in
    one line that says how (train it, or give weights) instead of a traceback."""
    from zoo import loading

    name = "resnet20_gap_fashion_mnist"
    os.makedirs(tmp_path / "presets" / name)
    for item in ("config.json", "metadata.json"):
        shutil.copy(os.path.join(preset_dir(name), item), tmp_path / "presets" / name / item)
    monkeypatch.setattr(loading, "PRESETS_DIR", str(tmp_path / "presets"))
    options = [str(tmp_path / "out") if option == "OUT" else option for option in options]
    err = _fails_with([command, name, *options], f"otzoo train {name}", capsys)
    assert "has no pretrained weights" in err and "--weights" in err


@pytest.mark.parametrize("breakage, message", [
    ("config_truncated", "config.json' is not valid JSON"),
    ("config_missing", "has no config.json"),
    ("config_not_a_model", "does not describe a model Keras can build"),
    ("task_unknown", "`task` must be one of"),
    ("name_not_a_string", "names no built-in preset"),
])
def test_a_preset_directory_with_a_broken_config_or_card_is_one_line(breakage, message, tmp_path, capsys):
    """A preset directory is the user's input: a config.json that is cut short, missing or not a model, and a card
    stating an unknown task or a name that is not a string, ended in tracebacks (JSONDecodeError,
    FileNotFoundError, Keras' and the task check's ValueError, TypeError)."""
    directory = tmp_path / "copy"
    shutil.copytree(preset_dir("resnet20_gap_fashion_mnist"), directory)
    card = json.loads((directory / "metadata.json").read_text())
    if breakage == "config_truncated":
        (directory / "config.json").write_text((directory / "config.json").read_text()[:100])
    elif breakage == "config_missing":
        (directory / "config.json").unlink()
    elif breakage == "config_not_a_model":
        (directory / "config.json").write_text(json.dumps({"class_name": "NoSuchModel", "config": {}}))
    elif breakage == "task_unknown":
        card["task"] = "bogus"
    else:
        card["name"] = ["resnet20_gap_fashion_mnist"]
    (directory / "metadata.json").write_text(json.dumps(card))
    command = (["evaluate", str(directory)] if breakage == "name_not_a_string" else
               ["export", str(directory), "--out", str(tmp_path / "out"), "--no-verify"])
    _fails_with(command, message, capsys)
    assert not (tmp_path / "out").exists()


def test_a_broken_preset_directory_or_foreign_weights_are_one_line(tmp_path, capsys):
    """A card that is not JSON, a directory without its weights, another architecture's weights or a file that is
    no weights file ended in a traceback (JSONDecodeError, FileNotFoundError, Keras' ValueError)."""
    garbled, weightless = tmp_path / "garbled", tmp_path / "weightless"
    garbled.mkdir()
    (garbled / "metadata.json").write_text("garbage")
    weightless.mkdir()
    for name in ("metadata.json", "config.json"):
        shutil.copy(os.path.join(preset_dir("resnet20_gap_fashion_mnist"), name), weightless / name)
    _fails_with(["evaluate", str(garbled), "--limit", "256"], "is not valid JSON", capsys)
    _fails_with(["export", str(garbled), "--out", str(tmp_path / "o"), "--no-verify"], "is not valid JSON", capsys)
    _fails_with(["evaluate", str(weightless), "--limit", "256"], "has no model.weights.h5", capsys)
    _fails_with(["evaluate", "resnet20_gap_fashion_mnist", "--limit", "256", "--weights",
                 preset_dir("resnet20_mpw_fashion_mnist")],
                "do not load into 'resnet20_gap_fashion_mnist'", capsys)
    (tmp_path / "not_weights.h5").write_text("plain text")
    _fails_with(["evaluate", "resnet20_gap_fashion_mnist", "--limit", "256", "--weights",
                 str(tmp_path / "not_weights.h5")], "do not load into", capsys)


def test_a_backend_keras_does_not_know_is_one_line(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="nope")
    proc = subprocess.run([sys.executable, "-m", "otzoo", "list"], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == ["otzoo: error: backend: Keras cannot run on 'nope' (KERAS_BACKEND); otzoo "
                                        "runs on tensorflow, jax, torch"], proc.stderr[-2000:]


def test_weights_at_a_url_that_cannot_be_fetched_are_one_line(tmp_path, monkeypatch, capsys):
    """Keras' download error (a bare ``Exception``) was a traceback; it is now ``WeightsDownloadError``, with the
    HTTP status, and no partial download stays in the cache. A local server answers 404 (no network needed)."""
    import http.server
    import threading

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras_home"))
    url = f"http://127.0.0.1:{server.server_address[1]}/model.weights.h5"
    try:
        _fails_with(["evaluate", "resnet20_gap_fashion_mnist", "--weights", url],
                    f"`weights`: could not fetch {url} (HTTP 404 Not Found)", capsys)
    finally:
        server.shutdown()
        server.server_close()
    cached = [files for _, _, files in os.walk(tmp_path / "keras_home") if files]
    assert not cached, cached


def test_a_resolution_beyond_print_quality_is_refused_before_any_work(tmp_path, capsys):
    """``--dpi 100000`` computed the explanations, then failed in matplotlib (a figure side over 2**16 pixels)."""
    _fails_with(["explain", "resnet20_gap_fashion_mnist", "--dpi", "601", "--out", str(tmp_path / "out")],
                "argument --dpi: must be an integer <= 600, got '601'", capsys)
    assert not (tmp_path / "out").exists()


def test_an_output_that_cannot_be_written_is_one_line_before_the_work(tmp_path, capsys, monkeypatch):
    """/proc takes no new directory, not even root's (whom the permission bits do not stop): each command failed on
    it with a traceback, fine-tune and demo only after fitting, so the output path must be created in, not only
    shaped like a directory."""
    from ot_layers.validation import check_output_path, output_path_problem

    monkeypatch.setattr(cli.zoo, "load", lambda *a, **k: pytest.fail("the command started its work"))
    monkeypatch.setattr(cli, "train_preset", lambda *a, **k: pytest.fail("the command started its work"))
    for args in (["train", "resnet20_gap_fashion_mnist", "--limit", "256"], ["tune", "resnet20_gap_fashion_mnist"],
                 ["explain", "resnet20_mpw_fashion_mnist", "--kinds", "mpw"], ["export", "resnet20_gap_fashion_mnist"],
                 ["demo"], ["fine-tune", "resnet20_gap_fashion_mnist"]):
        _fails_with(args + ["--out", "/proc/otzoo_x"], "argument --out: '/proc/otzoo_x' cannot be written: nothing "
                    "can be created in '/proc'", capsys)
    assert "cannot be written" in output_path_problem("/proc/otzoo_x/model.onnx", directory=False)
    with pytest.raises(ValueError, match="^`out_dir` '/proc/otzoo_x' cannot be written"):
        check_output_path("out_dir", "/proc/otzoo_x", directory=True)
    # a writable place passes, and the probe leaves nothing behind
    assert output_path_problem(str(tmp_path / "new" / "dir"), directory=True) is None
    assert output_path_problem(str(tmp_path), directory=True) is None
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command, default", [("train", "otzoo_runs"), ("tune", "otzoo_tune")])
def test_a_default_output_directory_that_cannot_be_written_names_out(command, default, tmp_path, capsys,
                                                                     monkeypatch):
    """The default --out (otzoo_runs/PRESET, otzoo_tune/PRESET) was never checked: a file otzoo_runs here ended in
    a ValueError traceback naming `out_dir`."""
    from otzoo import tune_command

    monkeypatch.chdir(tmp_path)
    (tmp_path / default).write_text("")
    monkeypatch.setattr(cli, "train_preset", lambda *a, **k: pytest.fail("the run started"))
    monkeypatch.setattr(tune_command, "tune", lambda *a, **k: pytest.fail("the search started"))
    _fails_with([command, "resnet20_gap_fashion_mnist", "--limit", "256", "--epochs", "1"],
                f"error: --out (default {os.path.join(default, 'resnet20_gap_fashion_mnist')}): "
                f"'{os.path.join(default, 'resnet20_gap_fashion_mnist')}' is below the file", capsys)


def test_export_names_the_model_after_the_absolute_path(tmp_path, capsys, monkeypatch):
    """`otzoo export .` took the name ".": the SavedModel went to OUT/1 and the ONNX file to a hidden OUT/..onnx;
    with `..` the SavedModel and models.config went outside --out. The name comes from the absolute path, and one
    that begins with no letter or digit is refused before the model loads."""
    model = zoo.image_classifier("small_convnet", "gap_fc", 10, input_shape=(28, 28, 1),
                                 backbone_kwargs={"width": 4, "feature_dim": 8})
    zoo.save_preset(model, str(tmp_path / "own"))
    (tmp_path / "own" / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "own")
    assert cli.main(["export", ".", "--out", str(tmp_path / "dot"), "--format", "saved_model", "--no-verify"]) == 0
    assert sorted(os.listdir(tmp_path / "dot")) == ["own"]
    assert sorted(os.listdir(tmp_path / "dot" / "own")) == ["1", "models.config"]
    monkeypatch.chdir(tmp_path / "own" / "sub")
    assert cli.main(["export", "..", "--out", str(tmp_path / "dots"), "--format", "saved_model", "--no-verify"]) == 0
    assert sorted(os.listdir(tmp_path / "dots" / "own")) == ["1", "models.config"]
    assert sorted(os.listdir(tmp_path)) == ["dot", "dots", "own"]  # nothing written beside --out
    capsys.readouterr()
    shutil.copytree(tmp_path / "own", tmp_path / ".hidden")
    monkeypatch.setattr(cli.zoo, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    _fails_with(["export", str(tmp_path / ".hidden"), "--out", str(tmp_path / "h")],
                "NAME_OR_PATH: '" + str(tmp_path / ".hidden") + "' gives the model name '.hidden', which must begin "
                "with a letter or digit", capsys)
    assert not (tmp_path / "h").exists()


@pytest.mark.parametrize("error", [AttributeError("'NoneType' object has no attribute 'units'"), MemoryError(),
                                   KeyError("loss"), TypeError("unsupported operand type(s)")])
def test_an_internal_error_while_a_keras_file_loads_keeps_its_traceback(error, tmp_path, monkeypatch):
    """Every exception of keras.saving.load_model became a one-line "cannot load" user error; only what a damaged
    or foreign file raises does (tests/test_export_command.py: a zip without a model, not a zip, and the
    ``TypeError``s Keras' own code raises for a config its layers do not take). A ``TypeError`` raised outside Keras'
    code (here by this test, as by a layer's ``from_config``) is a bug and keeps its traceback."""
    from otzoo import export_command

    path = tmp_path / "m.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("config.json", "{}")
    def load_model(path, **kwargs):
        raise error

    monkeypatch.setattr(export_command.keras.saving, "load_model", load_model)
    with pytest.raises(type(error)):
        cli.main(["export", str(path), "--out", str(tmp_path / "out")])
    for readable in (ValueError("Could not deserialize 'keras.layers.Dinse'"),
                     KeyError("There is no item named 'config.json' in the archive"), OSError("file signature")):
        monkeypatch.setattr(export_command.keras.saving, "load_model", lambda path, error=readable, **kwargs: (
            _raising(error)(path)))
        with pytest.raises(SystemExit) as exit_info:
            raise SystemExit(cli.main(["export", str(path), "--out", str(tmp_path / "out")]))
        assert exit_info.value.code == 2


def test_demo_on_jax_or_torch_does_not_replace_an_earlier_fine_tuned_preset(tmp_path, capsys, monkeypatch):
    """On JAX and PyTorch the demo saves OUT/fine_tuned, and a second run replaced the first without a word; it is
    refused before the work, as otzoo fine-tune refuses a directory holding a preset."""
    (tmp_path / "fine_tuned").mkdir()
    (tmp_path / "fine_tuned" / "metadata.json").write_text("{}")
    monkeypatch.setattr(cli.keras.backend, "backend", lambda: "jax")
    monkeypatch.setattr(cli.zoo, "load", lambda *a, **k: pytest.fail("the demo started its work"))
    _fails_with(["demo", "--limit", "128", "--test-limit", "100", "--out", str(tmp_path)],
                "--out: '" + str(tmp_path / "fine_tuned") + "' holds a preset already (metadata.json)", capsys)
    assert os.listdir(tmp_path / "fine_tuned") == ["metadata.json"]


def test_evaluate_with_weights_compares_with_their_own_card(tmp_path, capsys, monkeypatch):
    """`otzoo evaluate P --weights W` printed the packaged card's metrics beside W's: compared with W's own card
    (its preset directory's), and with none for weights that come without one."""
    from training.recipes.common import evaluation_target

    run = tmp_path / "run"
    shutil.copytree(preset_dir("resnet20_gap_fashion_mnist"), run)
    card = json.loads((run / "metadata.json").read_text())
    card["metrics"] = {"accuracy": 0.1263}
    (run / "metadata.json").write_text(json.dumps(card))
    _, _, target_card = evaluation_target("resnet20_gap_fashion_mnist", weights=str(run))
    assert target_card["metrics"] == {"accuracy": 0.1263}
    lone = tmp_path / "lone.weights.h5"
    shutil.copy(run / "model.weights.h5", lone)
    with pytest.warns(UserWarning, match="without a card"):
        assert evaluation_target("resnet20_gap_fashion_mnist", weights=str(lone))[2] == {}
    # what the command prints from it (the recipe's evaluation itself stubbed: tests/test_evaluation_arguments.py)
    given = {}

    def evaluated(preset, weights=None, limit=None, **options):
        given["weights"] = weights
        card_metrics = evaluation_target(preset, weights=weights)[2].get("metrics")
        return dict(metrics={"accuracy": 0.5}, card_metrics=card_metrics, examples=300)

    monkeypatch.setattr(cli, "evaluate_preset", evaluated)
    assert cli.main(["evaluate", "resnet20_gap_fashion_mnist", "--weights", str(run), "--limit", "300"]) == 0
    out = capsys.readouterr().out
    assert "accuracy 0.5000 (card: 0.1263) on 300 test images" in out, out
    with pytest.warns(UserWarning, match="without a card"):
        assert cli.main(["evaluate", "resnet20_gap_fashion_mnist", "--weights", str(lone), "--limit", "300"]) == 0
    out = capsys.readouterr().out
    assert "(card:" not in out and "nothing to compare with" in out, out


def test_tune_refuses_an_earlier_search_without_resume_or_overwrite(tmp_path, capsys, monkeypatch):
    """``otzoo tune`` without --resume replaced the search in --out without a word (keras-tuner's own default,
    ``overwrite=False``, resumes it): an --out holding a search (tuner/, best.json) is refused in one line naming
    --resume and --overwrite, before anything is read; --resume continues it, --overwrite replaces it, and --resume
    with no search there says so and starts one."""
    from otzoo import tune_command

    searches = []
    monkeypatch.setattr(tune_command, "tune", lambda *args, **kwargs: searches.append(kwargs["resume"]))
    out = tmp_path / "tune"
    command = ["tune", "resnet20_mpw_fashion_mnist", "--trials", "2", "--out", str(out)]
    assert cli.main(command) == 0 and searches == [False]  # a new directory: a new search
    assert capsys.readouterr().err == ""
    assert cli.main(command + ["--resume"]) == 0 and searches == [False, True]
    assert capsys.readouterr().err.strip() == (f"otzoo tune: --resume: no search in {out} to resume; starting a new "
                                               "one")
    for earlier in ("tuner", "best.json"):
        path = out / earlier
        if earlier == "tuner":
            path.mkdir(parents=True)
            (path / "oracle.json").write_text("{}")
        else:
            path.write_text("{}")
        _fails_with(command, f"error: --out {out} holds an earlier search ({earlier}); pass --resume to continue it, "
                    "or --overwrite to start a new search in its place.", capsys)
        assert searches == [False, True]
        shutil.rmtree(out / "tuner") if earlier == "tuner" else os.remove(path)
    (out / "tuner").mkdir()
    (out / "tuner" / "oracle.json").write_text("{}")
    assert cli.main(command + ["--resume"]) == 0 and cli.main(command + ["--overwrite"]) == 0
    assert searches == [False, True, True, False] and capsys.readouterr().err == ""
    _fails_with(command + ["--resume", "--overwrite"], "argument --overwrite: not allowed with argument --resume",
                capsys)


@pytest.mark.parametrize("name, changes, message", [
    ("resnet20_gap_fashion_mnist", {"task": ["classification"]},
     "`task` must be one of ['classification', 'retrieval', 'few_shot'], got ['classification']"),
    ("resnet20_gap_fashion_mnist", {"fine_tuned": "yes"}, "`fine_tuned` must be an object describing the "
                                                          "fine-tuning run (its `base`: the preset fine-tuned), got"),
    ("resnet20_gap_fashion_mnist", {"recipe": 5}, "`recipe` must be an object of recipe fields, got 5"),
    ("resnet20_gap_fashion_mnist", {"recipe.callbacks": 5}, "`recipe.callbacks` must be a list of strings, got 5"),
    ("resnet20_gap_fashion_mnist", {"recipe.jit_compile": "no"}, "`recipe.jit_compile` must be true or false"),
    ("resnet20_gap_fashion_mnist", {"recipe.learning_rate": "0.1"}, "`recipe.learning_rate` must be a number"),
    ("resnet20_protonet_fewshot_fashion_mnist", {"recipe.eval_shots": "15"},
     "`recipe.eval_shots` must be a list of integers, got '15'"),
    ("resnet20_protonet_fewshot_fashion_mnist", {"recipe.eval_episodes": "5"},
     "`recipe.eval_episodes` must be an integer, got '5'"),
], ids=["task_list", "fine_tuned_string", "recipe_int", "callbacks_int", "jit_compile_string", "learning_rate_string",
        "eval_shots_string", "eval_episodes_string"])
def test_evaluate_names_a_card_field_of_the_wrong_type(name, changes, message, tmp_path, capsys):
    """Each was a traceback: TypeError (a list is no key of the recipes' table; tuple('15') is ('1', '5'); an int
    is not iterable), AttributeError ('str' object has no attribute 'get'), the episodes' own ValueError."""
    directory = tmp_path / "copy"
    shutil.copytree(preset_dir(name), directory)
    card = json.loads((directory / "metadata.json").read_text())
    for key, value in changes.items():
        if key.startswith("recipe."):
            card["recipe"][key[len("recipe."):]] = value
        else:
            card[key] = value
    (directory / "metadata.json").write_text(json.dumps(card))
    err = _fails_with(["evaluate", str(directory), "--limit", "300"], message, capsys)
    assert f"PRESET: the card of {str(directory)!r}" in err, err


def test_export_names_a_recipe_field_of_the_wrong_type(tmp_path, capsys):
    directory = tmp_path / "copy"
    shutil.copytree(preset_dir("resnet20_gap_fashion_mnist"), directory)
    card = json.loads((directory / "metadata.json").read_text())
    card["recipe"]["callbacks"] = 5
    (directory / "metadata.json").write_text(json.dumps(card))
    _fails_with(["export", str(directory), "--out", str(tmp_path / "out"), "--no-verify"],
                "`recipe.callbacks` must be a list of strings, got 5", capsys)
    assert not (tmp_path / "out").exists()


def test_a_config_json_that_is_no_model_is_one_line(tmp_path, capsys):
    """``{}`` deserialized into a dict: AttributeError ('dict' object has no attribute 'inputs')."""
    directory = tmp_path / "copy"
    shutil.copytree(preset_dir("resnet20_gap_fashion_mnist"), directory)
    (directory / "config.json").write_text("{}")
    _fails_with(["evaluate", str(directory), "--limit", "300"], "does not describe a model Keras can build: it gives "
                                                                "a dict, not a model", capsys)
