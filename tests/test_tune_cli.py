"""``otzoo tune``: keras-tuner random search over the MPW head's parameters and the learning rate on a
validation part carved from the training split; the summary and ``best.json`` name keras-tuner's best trial."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from otzoo import cli
from training.data.fashion_mnist import fashion_mnist_dir
from training.tuning.search import held_out_classes_split, search_space, validation_split
from training.recipes.tuned_config import check_tuned_head, load_tuned_config
from zoo.registry import PRESETS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = "resnet20_mpw_fashion_mnist"
# On PYTHONPATH, this folder's sitecustomize makes ``import tensorflow`` fail, as on a machine without TensorFlow.
WITHOUT_TENSORFLOW = os.path.join(ROOT, "tests", "backends", "without_tensorflow_site")


def _training_split_only(tmp_path):
    """A Fashion-MNIST folder holding the real training files and unreadable test files: a search that read the
    test split would fail."""
    data = tmp_path / "fashion"
    data.mkdir()
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        os.symlink(os.path.join(fashion_mnist_dir(), name), data / name)
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        (data / name).write_bytes(b"not the test split")
    return data


def _recorded_trials(out, preset):
    """keras-tuner's own record of the trials of a search in ``out`` (independent of otzoo's summary code), by id."""
    trials = [json.load(open(path)) for path in glob.glob(str(out / "tuner" / preset / "trial_*" / "trial.json"))]
    return {trial["trial_id"]: trial for trial in trials}


@pytest.mark.slow  # three trainings in a subprocess: 25-38 s measured on the 2-core dev machine
@pytest.mark.fashion_mnist
def test_tune_three_trials_from_the_cli_reports_the_best(tmp_path):
    out = tmp_path / "tune"
    env = dict(os.environ, OTZOO_FASHION_MNIST=str(_training_split_only(tmp_path)), CUDA_VISIBLE_DEVICES="",
               TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, "-m", "otzoo", "tune", PRESET, "--trials", "3", "--limit", "512",
                             "--epochs", "1", "--batch-size", "64", "--backbone", "small_convnet", "--out", str(out)],
                            env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    config = load_tuned_config(str(out / "best.json"), preset=PRESET)

    recorded = _recorded_trials(out, PRESET)
    assert len(recorded) == 3 and all(t["status"] == "COMPLETED" for t in recorded.values())
    best_id = max(recorded, key=lambda k: recorded[k]["score"])
    best = recorded[best_id]["hyperparameters"]["values"]
    assert config["score"] == pytest.approx(recorded[best_id]["score"])
    assert config["learning_rate"] == pytest.approx(best["learning_rate"])
    assert config["head_kwargs"] == {"epsilon": pytest.approx(best["epsilon"]), "num_proxies": best["num_proxies"]}
    assert 0.02 <= config["head_kwargs"]["epsilon"] <= 0.5 and config["head_kwargs"]["num_proxies"] in (1, 2, 4, 8)
    assert config["search"]["train_examples"] + config["search"]["validation_examples"] == 512
    # Each trial's signals are the MPW head's solver logs that keras-tuner recorded at the trial's scored epoch
    for trial in config["trials"]:
        logged = recorded[trial["trial_id"]]["metrics"]["metrics"]
        assert set(trial["signals"]) == {"mpw_head_sinkhorn_iterations", "mpw_head_marginal_error"}, trial
        for name, value in trial["signals"].items():
            assert value == pytest.approx(logged[name]["observations"][-1]["value"][0])
        assert 1 <= trial["signals"]["mpw_head_sinkhorn_iterations"] <= 100  # the head's max_iter

    table = result.stdout[result.stdout.index("otzoo tune"):].splitlines()
    assert table[0].startswith(f"otzoo tune {PRESET}: 3 trial(s), best first")
    rows = [line.split() for line in table[2:5]]
    assert [r[1] for r in rows][0] == best_id
    assert [float(r[2]) for r in rows] == sorted((round(t["score"], 4) for t in recorded.values()), reverse=True)
    assert f"best: trial {best_id}" in result.stdout


@pytest.mark.long
@pytest.mark.slow  # two GSP trainings (small ConvNet, 2 epochs) in a subprocess
@pytest.mark.fashion_mnist
def test_tune_a_retrieval_preset_scores_map_at_r_on_held_out_seen_classes(tmp_path):
    preset = "resnet20_gsp_retrieval_fashion_mnist"
    data = _training_split_only(tmp_path)
    out = tmp_path / "tune"
    env = dict(os.environ, OTZOO_FASHION_MNIST=str(data), CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, "-m", "otzoo", "tune", preset, "--trials", "2", "--limit",
                             "1200", "--epochs", "2", "--batch-size", "64", "--backbone", "small_convnet", "--out",
                             str(out)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    config = load_tuned_config(str(out / "best.json"), preset=preset)
    recorded = list(_recorded_trials(out, preset).values())
    assert len(recorded) == 2 and all(t["status"] == "COMPLETED" for t in recorded)
    best = max(recorded, key=lambda t: t["score"])
    assert config["objective"] == "val_map_at_r" and config["score"] == pytest.approx(best["score"])
    assert config["head_kwargs"]["epsilon"] == pytest.approx(best["hyperparameters"]["values"]["epsilon"])
    assert 0.05 <= config["head_kwargs"]["epsilon"] <= 2.0 and 0.0 < config["score"] <= 1.0
    assert all({"gsp_transport_iterations", "gsp_marginal_error", "gsp_prototypes_initialized"}
               <= set(trial["signals"]) for trial in config["trials"]), config["trials"]
    # The held-out classes 3 and 4 of the first 1,200 training images; the rest (classes 0-2) trained on.
    labels = np.frombuffer(__import__("gzip").open(data / "train-labels-idx1-ubyte.gz").read()[8:], np.uint8)[:1200]
    assert config["search"]["validation_examples"] == int(np.isin(labels, [3, 4]).sum())
    assert config["search"]["train_examples"] == int(np.isin(labels, [0, 1, 2]).sum())


@pytest.mark.long
@pytest.mark.slow  # two small-ConvNet trials in a subprocess: 25 s (JAX) and 15 s (PyTorch) on the 2-core machine
@pytest.mark.fashion_mnist
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_tune_runs_without_tensorflow_and_tensorflow_scores_its_trials_alike(backend, tmp_path):
    """``otzoo --backend jax|torch tune`` where ``import tensorflow`` fails: the search completes, and TensorFlow
    (this process), loading each trial's checkpoint into the trial's architecture, computes the validation accuracy
    keras-tuner recorded for it (the trial trained and scored on the other backend, the score taken by the last
    epoch's weights, which keras-tuner checkpoints)."""
    pytest.importorskip(backend)
    from training.recipes.classification import tuning_data
    from zoo.loading import build

    data, out = _training_split_only(tmp_path), tmp_path / "tune"
    env = dict(os.environ, OTZOO_FASHION_MNIST=str(data), KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([WITHOUT_TENSORFLOW, ROOT]))
    result = subprocess.run([sys.executable, "-m", "otzoo", "--backend", backend, "tune", PRESET, "--trials", "2",
                             "--limit", "512", "--epochs", "1", "--batch-size", "64", "--backbone", "small_convnet",
                             "--out", str(out)], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    recorded = _recorded_trials(out, PRESET)
    assert len(recorded) == 2 and all(t["status"] == "COMPLETED" for t in recorded.values())
    config = load_tuned_config(str(out / "best.json"), preset=PRESET)
    assert config["score"] == pytest.approx(max(t["score"] for t in recorded.values()))

    os.environ["OTZOO_FASHION_MNIST"], previous = str(data), os.environ.get("OTZOO_FASHION_MNIST")
    try:
        _, (images, labels), _ = tuning_data(512, 0.2, 0)  # the search's validation part (--seed 0)
    finally:
        if previous is None:
            del os.environ["OTZOO_FASHION_MNIST"]
        else:
            os.environ["OTZOO_FASHION_MNIST"] = previous
    for trial_id, trial in recorded.items():
        values = trial["hyperparameters"]["values"]
        model = build(PRESET, backbone="small_convnet", epsilon=values["epsilon"], num_proxies=values["num_proxies"])
        model.load_weights(str(out / "tuner" / PRESET / f"trial_{trial_id}" / "checkpoint.weights.h5"))
        accuracy = float(np.mean(np.argmax(model.predict(images, verbose=0), axis=-1) == labels))
        assert abs(accuracy - trial["score"]) <= 1 / len(labels) + 1e-9, (trial_id, accuracy, trial["score"])


def test_a_trial_trains_by_the_recipe_weight_decay_included():
    """A trial (``otzoo tune``'s, and a budget-selection run of ``experiments/gpu_presets.py``) trains what ``otzoo
    train`` trains: the ResNet backbone's convolutions carry the recipe's L2 penalty (the trials used to leave it
    out), the sampled head arguments reach the head, and a small backbone swapped in for a quick search has no
    penalty."""
    import keras

    from training.tuning.trial import trial_setup

    spec = PRESETS[PRESET].with_recipe(epochs=2, batch_size=16, learning_rate=0.01)
    images = np.random.default_rng(0).integers(0, 256, (40, 28, 28, 1)).astype(np.uint8)
    labels = np.arange(40) % 10
    keras.utils.set_random_seed(0)
    trial = trial_setup(spec, (images, labels), {"num_proxies": 2})
    kernels = [layer.kernel for layer in trial.served.get_layer("backbone")._flatten_layers()
               if isinstance(layer, keras.layers.Conv2D)]
    expected = spec.recipe.l2 * sum(float(np.sum(np.square(keras.ops.convert_to_numpy(k)))) for k in kernels)
    penalty = sum(float(keras.ops.convert_to_numpy(loss)) for loss in trial.trained.losses)
    assert spec.recipe.l2 > 0 and len(kernels) > 10 and penalty == pytest.approx(expected, rel=1e-5)
    assert trial.served.get_layer("mpw_head").num_proxies == 2
    assert float(keras.ops.convert_to_numpy(trial.trained.optimizer.learning_rate)) == pytest.approx(0.01)
    quick = trial_setup(spec, (images, labels), backbone="small_convnet")
    assert quick.trained.losses == [] and quick.served.get_layer("small_convnet") is not None


def test_a_trial_starts_alike_whatever_ran_before_it():
    """A trial's initialization is a function of the search's seed and the trial's values only: it was drawn from
    the process's random state, so a resumed search scored a trial otherwise than a fresh one (0.1406 against
    0.1797 for the same values)."""
    import keras
    import keras_tuner as kt

    from training.tuning.search import _preset_hypermodel

    spec = PRESETS[PRESET].with_recipe(epochs=1, batch_size=16)
    images = np.random.default_rng(0).integers(0, 256, (40, 28, 28, 1)).astype(np.uint8)
    labels = np.arange(40) % 10
    data = ((images, labels), (images, labels))

    def initial_weights(seed, learning_rate=None):
        hp = kt.HyperParameters()
        hypermodel = _preset_hypermodel(spec, search_space(spec), data, "small_convnet", seed)
        hypermodel.build(hp)  # the defaults, registered
        if learning_rate is not None:
            hp.values["learning_rate"] = learning_rate
        return [keras.ops.convert_to_numpy(w) for w in hypermodel.build(hp).weights]

    first = initial_weights(0)
    other = initial_weights(0, learning_rate=0.3)
    again = initial_weights(0)
    for w, v in zip(first, again):
        np.testing.assert_array_equal(w, v)
    assert any(np.any(w != v) for w, v in zip(first, other))  # other values: another draw
    assert any(np.any(w != v) for w, v in zip(first, initial_weights(1)))  # another search seed: another draw


def test_validation_split_is_stratified_and_disjoint():
    labels = np.repeat(np.arange(4), 10)
    images = np.arange(40)[:, None]
    (x_train, y_train), (x_val, y_val) = validation_split(images, labels, 0.2, seed=1)
    assert sorted(np.concatenate([x_train, x_val]).ravel().tolist()) == list(range(40))
    assert np.bincount(y_val).tolist() == [2, 2, 2, 2]
    assert np.array_equal(images[x_val.ravel()].ravel(), x_val.ravel()) and np.array_equal(labels[x_val.ravel()], y_val)
    with pytest.raises(ValueError, match="`validation_fraction` must lie in"):
        validation_split(images, labels, 1.0)


def test_held_out_classes_split_is_the_retrieval_protocol_on_the_seen_classes():
    labels = np.repeat(np.arange(5), 6)  # the retrieval presets' seen classes 0-4
    images = np.arange(30)[:, None]
    (x_fit, y_fit), (x_val, y_val) = held_out_classes_split(images, labels, 0.2, per_class=4)
    assert np.array_equal(labels[x_fit.ravel()], y_fit) and set(y_fit.tolist()) == {0, 1, 2}
    assert y_val.tolist() == [3] * 4 + [4] * 4  # two classes held out (at least two), the first 4 images of each
    assert np.array_equal(labels[x_val.ravel()], y_val) and not set(x_fit.ravel()) & set(x_val.ravel())
    shifted = held_out_classes_split(images, labels + 5, 0.4)[0][1]  # fit labels become 0..C'-1
    assert set(shifted.tolist()) == {0, 1, 2}
    with pytest.raises(ValueError, match="`validation_fraction` 0.7: holding out 4 of the 5 seen classes"):
        held_out_classes_split(images, labels, 0.7)


def test_search_spaces_by_head():
    names = lambda spec: [p["name"] for p in search_space(spec)]  # noqa: E731
    assert names(PRESETS[PRESET]) == ["epsilon", "num_proxies", "learning_rate"]
    assert names(PRESETS["resnet20_hyperspherical_fashion_mnist"]) == ["dim", "learning_rate"]
    assert search_space(PRESETS["resnet20_hyperspherical_fashion_mnist"])[0]["values"] == [9, 16, 32, 64]
    assert names(PRESETS["resnet20_gsp_retrieval_fashion_mnist"]) == ["epsilon", "transport_ratio", "num_prototypes", "learning_rate"]
    assert names(PRESETS["resnet20_gap_retrieval_fashion_mnist"]) == ["learning_rate"]
    assert names(PRESETS["resnet20_emd_fewshot_fashion_mnist"]) == ["scale", "learning_rate"]
    assert names(PRESETS["resnet20_gap_fashion_mnist"]) == ["learning_rate"]


@pytest.mark.parametrize("args, option", [
    (["tune", PRESET, "--trials", "0"], "argument --trials: must be an integer >= 1"),
    (["tune", PRESET, "--backbone", "vgg99"], "argument --backbone: unknown backbone 'vgg99'"),
    (["tune", PRESET, "--validation-fraction", "1.5"], "argument --validation-fraction: must be a number in (0, 1)"),
    (["tune", "resnet99"], "argument preset: unknown preset 'resnet99'"),
])
def test_tune_bad_input_is_one_line_and_exit_2(args, option, capsys):
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(cli.main(args))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert option in err and len(err.splitlines()) == 1


def test_tune_from_python_names_what_the_command_line_types_check(tmp_path):
    """batch_size=0 trained with the recipe's 128 without a word; a negative seed was NumPy's error, a file as
    out_dir a FileExistsError, a list as preset a TypeError, and an unknown backbone was refused by the first
    trial's build, once out_dir held the search's run.json. Each is one line naming the argument, and nothing is
    written."""
    from training.tuning.search import tune
    (tmp_path / "afile").write_text("")
    for kwargs, match in [({"batch_size": 0}, "^`batch_size` must be an integer >= 1"),
                          ({"seed": -1}, "^`seed`"),
                          ({"out_dir": str(tmp_path / "afile")}, "^`out_dir` .* is a file"),
                          ({"preset": [PRESET]}, r"^`preset` \['resnet20"),
                          # the first trial's build refused it, after run.json and tuner/ were written in out_dir
                          ({"backbone": "vgg99"}, "^`backbone` 'vgg99' is unknown; known backbones: resnet20"),
                          ]:
        arguments = {"preset": PRESET, "trials": 1, "out_dir": str(tmp_path / "search"), "limit": 200, **kwargs}
        with pytest.raises(ValueError, match=match):
            tune(**arguments)
    assert sorted(os.listdir(tmp_path)) == ["afile"]


def test_tune_from_python_refuses_an_earlier_search_unless_told(tmp_path, monkeypatch):
    """tune() called twice with one out_dir replaced the first search (keras-tuner's overwrite=True) without a word;
    the command line refused it, Python did not. Now either resume=True or overwrite=True is needed."""
    from training.tuning import search
    out = tmp_path / "search"
    (out / "tuner").mkdir(parents=True)
    (out / "tuner" / "oracle.json").write_text("{}")

    class Started(Exception):
        pass

    def claim(*args, **kwargs):
        raise Started

    monkeypatch.setattr(search, "claim_run_directory", claim)
    with pytest.raises(ValueError, match=r"^`out_dir` .* holds an earlier search \(tuner\); pass resume=True"):
        search.tune(PRESET, 1, str(out), limit=200)
    for flag in ("resume", "overwrite"):
        with pytest.raises(Started):
            search.tune(PRESET, 1, str(out), limit=200, **{flag: True})
    assert os.listdir(out / "tuner") == ["oracle.json"]
    for flags, match in (({"resume": True, "overwrite": True}, "^`overwrite`: .* not both"),
                         ({"overwrite": "yes"}, "^`overwrite` must be True or False")):
        with pytest.raises(ValueError, match=match):
            search.tune(PRESET, 1, str(out), limit=200, **flags)


def test_load_tuned_config_rejects_bad_files(tmp_path):
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"preset": PRESET, "head_kwargs": {"epsilon": 0.1}, "learning_rate": 0.05}))
    assert load_tuned_config(str(path), preset=PRESET)["head_kwargs"] == {"epsilon": 0.1}
    with pytest.raises(ValueError, match="was tuned for preset"):
        load_tuned_config(str(path), preset="resnet20_gap_fashion_mnist")
    path.write_text(json.dumps({"preset": PRESET, "learning_rate": 0.05}))
    with pytest.raises(ValueError, match="`config`"):
        load_tuned_config(str(path))
    for head_kwargs, message in (({"foo": 1}, "`foo` is not an architecture key .*MultiProxyWasserstein takes no "
                                               "argument `foo`; it takes num_proxies"),
                                 ({"num_proxies": -2}, "`num_proxies` must be an integer >= 1")):
        path.write_text(json.dumps({"preset": PRESET, "head_kwargs": head_kwargs, "learning_rate": 0.05}))
        config = load_tuned_config(str(path), preset=PRESET)  # a readable file: the head is checked apart
        with pytest.raises(ValueError, match=f"its head_kwargs .* do not fit preset '{PRESET}': {message}"):
            check_tuned_head(str(path), config, PRESET)


def test_a_card_names_the_tuned_head_it_was_trained_with(tmp_path):
    """A run with a tuned configuration records the head parameters it replaced, and its description says so (the
    preset's own text describes the preset's head: 4 proxies, epsilon 0.1)."""
    import tensorflow as tf

    from training.recipes.common import preset_spec, write_preset
    from zoo.loading import build

    spec = preset_spec(PRESET)
    tuned = {"num_proxies": 2, "epsilon": 0.04}
    model = build(PRESET, backbone="small_convnet", **tuned)
    card = write_preset(model, spec, str(tmp_path), spec.recipe, {"accuracy": 0.5}, 1.0, tf.distribute.get_strategy(),
                        "otzoo train ...", head_overrides=tuned)
    assert card["head_overrides"] == tuned and json.load(open(tmp_path / "metadata.json")) == card
    assert '{"epsilon": 0.04, "num_proxies": 2}' in card["description"] and "4 proxies" not in card["description"]
    (tmp_path / "plain").mkdir()
    plain = write_preset(model, spec, str(tmp_path / "plain"), spec.recipe, {"accuracy": 0.5}, 1.0,
                         tf.distribute.get_strategy(), "otzoo train ...")
    assert "head_overrides" not in plain and plain["description"] == spec.description
    # with --limit the preset's own text (trained on the whole split) would be false: the card's split is named
    (tmp_path / "limited").mkdir()
    limited = write_preset(model, spec, str(tmp_path / "limited"), spec.recipe, {"accuracy": 0.5}, 1.0,
                           tf.distribute.get_strategy(), "otzoo train ... --limit 256", limit=256)
    assert limited["description"] != spec.description and "first 256 images" in limited["description"]
    assert limited["split"] in limited["description"]


def test_tune_refuses_an_out_holding_a_trained_model(tmp_path, capsys):
    """``otzoo tune PRESET --out DIR`` where DIR holds a finished ``otzoo train`` run (its card and weights, no
    backup/) replaced the run's run.json with the search's and wrote tuner/ and best.json among the model's files;
    --overwrite (which replaces an earlier search) did the same. Now both the command and tune() refuse it in one
    line, and the directory is left as it was."""
    from training.tuning.search import tune
    out = tmp_path / "trained"
    out.mkdir()
    for name, text in (("metadata.json", "{}"), ("model.weights.h5", "weights"), ("run.json", '{"name": "x"}')):
        (out / name).write_text(text)
    for flags in ([], ["--overwrite"]):
        with pytest.raises(SystemExit) as exit_info:
            raise SystemExit(cli.main(["tune", PRESET, "--trials", "1", "--limit", "200", "--batch-size", "32",
                                       "--backbone", "small_convnet", "--out", str(out)] + flags))
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip()
        assert f"--out {out} holds a trained model (metadata.json, model.weights.h5)" in err, err
        assert len(err.splitlines()) == 1
    for flags in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(ValueError, match=r"^`out_dir` .* holds a trained model \(metadata.json"):
            tune(PRESET, 1, str(out), limit=200, batch_size=32, backbone="small_convnet", verbose=0, **flags)
    assert sorted(os.listdir(out)) == ["metadata.json", "model.weights.h5", "run.json"]
    assert (out / "run.json").read_text() == '{"name": "x"}'


class _SearchStarted(Exception):
    """Raised in place of the search's first trial: the test stops where keras-tuner would start training."""


def _stop_before_the_trials(monkeypatch):
    """tune() runs to its search (checks, data, run directory claimed, an earlier search removed), then stops."""
    from training.tuning import search

    def started(*args, **kwargs):
        raise _SearchStarted

    monkeypatch.setattr(search, "_preset_hypermodel", started)


@pytest.mark.fashion_mnist
def test_resume_without_trials_to_resume_keeps_the_earlier_best_json(tmp_path, capsys, monkeypatch):
    """``--resume`` in an --out holding best.json but no tuner/ warned on stderr, then started a new search whose
    best.json replaced the earlier one: the earlier result was lost. Now the command and tune() refuse it in one line
    (the command naming --out and suggesting --overwrite) and best.json is left as it was."""
    from training.tuning.search import tune
    _stop_before_the_trials(monkeypatch)
    out = tmp_path / "search"
    out.mkdir()
    (out / "best.json").write_text('{"earlier": true}')
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(cli.main(["tune", PRESET, "--trials", "1", "--limit", "200", "--batch-size", "32",
                                   "--backbone", "small_convnet", "--resume", "--out", str(out)]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"otzoo tune: error: --out {out} holds the best.json of an earlier search but not its "
                          "trials (tuner/)"), err
    assert "--overwrite" in err and len(err.splitlines()) == 1
    with pytest.raises(ValueError, match=r"^`resume`: `out_dir` .* holds the best.json of an earlier search but "
                                         r"not its trials \(tuner/\).*overwrite=True"):
        tune(PRESET, 1, str(out), limit=200, batch_size=32, backbone="small_convnet", verbose=0, resume=True)
    assert sorted(os.listdir(out)) == ["best.json"] and (out / "best.json").read_text() == '{"earlier": true}'


@pytest.mark.fashion_mnist
def test_overwrite_removes_the_earlier_search_of_another_preset(tmp_path, capsys, monkeypatch):
    """``--overwrite`` cleared only keras-tuner's tuner/<PRESET> of the new search's preset: an earlier search of
    another preset left its tuner/<other> in place. Now the earlier search's own files (tuner/, best.json, its
    run.json record) are replaced, and nothing else in --out is touched."""
    _stop_before_the_trials(monkeypatch)
    other = "resnet20_hyperspherical_fashion_mnist"
    assert other in PRESETS and other != PRESET
    out = tmp_path / "search"
    (out / "tuner" / other / "trial_0").mkdir(parents=True)
    (out / "tuner" / other / "trial_0" / "trial.json").write_text("{}")
    (out / "tuner" / other / "oracle.json").write_text("{}")
    (out / "best.json").write_text(json.dumps({"preset": other}))
    (out / "run.json").write_text(json.dumps({"name": other}))
    (out / "notes.txt").write_text("mine")
    with pytest.raises(_SearchStarted):
        cli.main(["tune", PRESET, "--trials", "1", "--limit", "200", "--batch-size", "32", "--backbone",
                  "small_convnet", "--overwrite", "--out", str(out)])
    assert sorted(os.listdir(out)) == ["notes.txt", "run.json"]
    assert (out / "notes.txt").read_text() == "mine"
    assert json.load(open(out / "run.json"))["name"] == PRESET  # the new search's record


@pytest.mark.fashion_mnist
@pytest.mark.parametrize("preset, args, start", [
    # 4 of the 5 seen classes held out leave fewer than two to train on
    ("resnet20_gsp_retrieval_fashion_mnist", ["--validation-fraction", "0.9"], "--validation-fraction 0.9: "),
    # 1% of 2 images per class holds out none
    (PRESET, ["--validation-fraction", "0.01", "--limit", "20"], "--limit 20: "),
])
def test_a_validation_part_that_cannot_be_carved_names_the_options(preset, args, start, tmp_path, capsys):
    """The error named the Python arguments (`validation_fraction`, `limit`) rather than the options typed."""
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(cli.main(["tune", preset, "--out", str(tmp_path / "search")] + args))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"otzoo tune: error: {start}"), err
    assert "--validation-fraction" in err and "`" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "search").exists()
