"""``experiments/gpu_presets.py``: the budget chosen on validation data, then seeds, resumable run by run.

The fast tests check the choice of the budget and the time limit; the slow one runs the whole protocol at a CPU
scale on JAX in a process where TensorFlow cannot be imported (as on the GPU machine): the budget is the one with the
best validation score, the report's means are those of the cards the final runs wrote, and a second call finds
every run done.
"""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

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


def test_the_clock_starts_no_run_that_would_end_after_the_limit():
    clock = gpu_presets.Clock(100.0)
    assert clock.fits(50)  # nothing seen yet
    clock.record(30.0, 10)  # 3 s per epoch
    assert clock.fits(30) and not clock.fits(40)
    assert gpu_presets.Clock(None).fits(10 ** 6)


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
