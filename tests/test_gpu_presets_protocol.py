"""``experiments/gpu_presets.py``: the budget chosen on validation data, then seeds, resumable run by run.

The fast tests check the choice of the budget and the time limit; the slow one runs the whole protocol at a CPU
scale on JAX in a process where TensorFlow cannot be imported (as on the GPU machine): the budget is the one with the
best validation score, the report's means are those of the cards the final runs wrote, and a second call finds
every run done.
"""
import glob
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.resume_checks import weights_file_arrays

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "gpu_presets.py")
_spec = importlib.util.spec_from_file_location("gpu_presets", SCRIPT)
gpu_presets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_presets)


def _select(preset, epochs, seed, score):
    return dict(phase="select", preset=preset, epochs=epochs, seed=seed, validation_score=score)


def test_the_budget_is_the_best_mean_validation_score_the_smaller_on_a_tie():
    records = [_select("p", 10, 0, 0.80), _select("p", 10, 1, 0.90), _select("p", 20, 0, 0.86),
               _select("p", 20, 1, 0.86), _select("p", 40, 0, 0.84), _select("q", 10, 0, 0.5)]
    assert gpu_presets.chosen_budget(records, "p", [10, 20, 40]) == 20  # means 0.85, 0.86, 0.84
    records.append(_select("p", 40, 1, 0.88))
    assert gpu_presets.chosen_budget(records, "p", [10, 20, 40]) == 20  # 40's mean is 0.86 too: the smaller wins
    assert gpu_presets.chosen_budget(records, "q", [10, 20]) is None  # a budget without a run: no choice yet


def test_the_deadline_stops_between_epochs_when_the_next_would_end_after_the_limit():
    now = [0.0]
    deadline = gpu_presets.Deadline(100.0, clock=lambda: now[0])
    deadline.on_train_begin()
    deadline.on_epoch_begin(0)
    now[0] = 30.0
    deadline.on_epoch_begin(1)  # the slowest epoch took 30 s: 30 + 30 <= 100
    now[0] = 50.0
    deadline.on_epoch_begin(2)  # 50 + 30 <= 100 (the last epoch took 20 s)
    now[0] = 75.0
    with pytest.raises(gpu_presets.TimeLimitReached, match=r"before epoch 4 \(3 done and backed up\)"):
        deadline.on_epoch_begin(3)  # 75 + 30 > 100
    assert deadline.first_epoch == 0 and deadline.slowest == 30.0 and not deadline.fits()


def test_every_call_trains_at_least_one_epoch_and_a_resumed_run_names_its_first():
    now = [0.0]
    deadline = gpu_presets.Deadline(0.0, clock=lambda: now[0])
    assert deadline.fits()
    deadline.on_train_begin()
    deadline.on_epoch_begin(4)  # a run resumed at epoch 4: the call's first epoch runs whatever the limit
    now[0] = 10.0
    deadline.on_train_end()
    assert deadline.first_epoch == 4 and deadline.trained == 1 and not deadline.fits()
    deadline.on_train_begin()
    with pytest.raises(gpu_presets.TimeLimitReached):
        deadline.on_epoch_begin(0)  # the next run's first epoch would pass the limit
    unlimited = gpu_presets.Deadline(None)
    unlimited.on_train_begin()
    for epoch in range(3):
        unlimited.on_epoch_begin(epoch)
    assert unlimited.fits()


RUNNER = """
import runpy, sys
sys.path.insert(0, sys.argv[1])
from no_tensorflow import block_tensorflow
block_tensorflow()
sys.argv = sys.argv[2:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print("TENSORFLOW_LOADED", "tensorflow" in sys.modules)
"""


@pytest.mark.fashion_mnist
def test_a_slice_smaller_than_one_batch_names_limit():
    """384 images leave 118 of the retrieval preset's seen classes for training, fewer than its batch of 128: one
    line naming ``limit``, before a model is built (``fit`` would otherwise find no batch)."""
    from training.data.errors import EmptySliceError

    with pytest.raises(EmptySliceError, match=r"`limit` 384: 118 training images .* fewer than one batch of 128"):
        gpu_presets.validation_score("resnet20_gsp_retrieval_fashion_mnist", 1, 0, limit=384)


@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_the_protocol_runs_without_tensorflow_and_resumes(tmp_path):
    pytest.importorskip("jax")
    results, runs = str(tmp_path / "results"), str(tmp_path / "runs")
    preset = "resnet20_gap_fashion_mnist"
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")

    def call(*args):
        proc = subprocess.run([sys.executable, "-c", RUNNER, os.path.join(ROOT, "tests", "backends"), SCRIPT, *args],
                              capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=1200)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "TENSORFLOW_LOADED False" in proc.stdout
        return proc.stdout

    options = ["--results", results, "--runs", runs, "--presets", preset, "--budgets", "1", "2", "--select-seeds",
               "0", "--seeds", "0", "1", "--limit", "384"]
    call("run", *options)
    records = gpu_presets.read_records(results)
    scores = {r["epochs"]: r["validation_score"] for r in records if r["phase"] == "select"}
    finals = [r for r in records if r["phase"] == "final"]
    best = max(scores.values())
    assert sorted(scores) == [1, 2] and len(finals) == 2
    assert all(r["epochs"] == min(e for e, s in scores.items() if s == best) for r in finals)
    cards = []
    for record in finals:
        with open(os.path.join(record["out_dir"], "metadata.json")) as handle:
            cards.append(json.load(handle))
    assert all(card["backend"] == "jax" and card["recipe"]["epochs"] == finals[0]["epochs"] for card in cards)
    again = call("run", *options)
    assert "e1 s0:" not in again and len(gpu_presets.read_records(results)) == len(records)  # every run skipped
    call("report", "--results", results, "--output", str(tmp_path / "report.json"))
    with open(tmp_path / "report.json") as handle:
        summary = json.load(handle)["presets"][preset]
    assert summary["accuracy"]["mean"] == pytest.approx(np.mean([card["metrics"]["accuracy"] for card in cards]))

    # The same protocol stopped after every epoch (a time limit of 0: each call trains one epoch), each call resuming
    # the unfinished run from its backup, ends where the uninterrupted calls did: same losses, scores and weights.
    results_1, runs_1 = str(tmp_path / "results_1"), str(tmp_path / "runs_1")
    one_epoch = ["--results", results_1, "--runs", runs_1] + options[4:options.index("--seeds")] + \
        ["--seeds", "0", "--limit", "384", "--time-limit", "0"]
    outputs = [call("run", *one_epoch)]
    while "time limit" in outputs[-1]:
        assert len(outputs) < 8, outputs[-1]
        outputs.append(call("run", *one_epoch))
    budget = finals[0]["epochs"]
    assert len(outputs) == 3 + budget  # select e1, e2 (two calls), final seed 0 (budget calls)
    resumed = {(r["phase"], r["epochs"], r["seed"]): r for r in gpu_presets.read_records(results_1)}
    reference = {(r["phase"], r["epochs"], r["seed"]): r for r in records}
    assert sorted(resumed) == sorted(key for key in reference if key[2] == 0)
    for key, record in resumed.items():
        for field in ("validation_score", "loss", "metrics"):
            assert record.get(field) == reference[key].get(field), (key, field)
    assert resumed[("select", 2, 0)]["resumed_at_epoch"] == 1
    assert not glob.glob(os.path.join(runs_1, "*", "backup"))  # every finished run's backup is gone
    _assert_same_h5(os.path.join(reference[("final", budget, 0)]["out_dir"], "model.weights.h5"),
                    os.path.join(resumed[("final", budget, 0)]["out_dir"], "model.weights.h5"))


def _assert_same_h5(a, b):
    first, second = weights_file_arrays(a), weights_file_arrays(b)
    assert sorted(first) == sorted(second) and first
    for name in first:
        np.testing.assert_allclose(second[name], first[name], rtol=1e-5, atol=1e-7, err_msg=name)
