"""``experiments/gpu_presets.py``: the budget chosen on validation data, then seeds, resumable run by run.

The fast tests check the choice of the budget and the time limit; the slow one runs the whole protocol at a CPU
scale on JAX in a process where TensorFlow cannot be imported (as on the GPU machine): the budget is the one with the
best validation score, the report's means are those of the cards the final runs wrote, and a second call finds
every run done; calls stopped after every epoch, one run at a time or two side by side in worker processes, end
with the records and weights of the uninterrupted calls.
"""
import argparse
import csv
import glob
import importlib.util
import json
import os
import shutil
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


def _final(preset, epochs, seed, metrics):
    return dict(phase="final", preset=preset, epochs=epochs, seed=seed, metrics=metrics, hardware="GPU",
                backend="jax", limit=None)


def _write(results, record):
    """``record`` as the protocol stores it: one JSON file in ``results``, named by phase, preset, budget and seed."""
    path = gpu_presets._record_path(results, record["phase"], record["preset"], record["epochs"], record["seed"])
    with open(path, "w") as handle:
        json.dump(record, handle)


def test_the_budget_is_the_best_mean_validation_score_the_smaller_on_a_tie():
    records = [_select("p", 10, 0, 0.80), _select("p", 10, 1, 0.90), _select("p", 20, 0, 0.86),
               _select("p", 20, 1, 0.86), _select("p", 40, 0, 0.84), _select("q", 10, 0, 0.5)]
    assert gpu_presets.chosen_budget(records, "p", [10, 20, 40]) == 20  # means 0.85, 0.86, 0.84
    records.append(_select("p", 40, 1, 0.88))
    assert gpu_presets.chosen_budget(records, "p", [10, 20, 40]) == 20  # 40's mean is 0.86 too: the smaller wins
    assert gpu_presets.chosen_budget(records, "q", [10, 20]) is None  # a budget without a run: no choice yet


def test_the_report_says_when_the_best_budget_is_an_end_of_the_grid(tmp_path, capsys):
    records = [_select("up", 10, 0, 0.80), _select("up", 20, 0, 0.85), _select("up", 40, 0, 0.86),
               _select("down", 10, 0, 0.70), _select("down", 20, 0, 0.65), _select("mid", 10, 0, 0.5),
               _select("mid", 20, 0, 0.6), _select("mid", 40, 0, 0.55), _select("one", 10, 0, 0.5)]
    for record in records:
        _write(str(tmp_path), record)
    gpu_presets.main(["report", "--results", str(tmp_path)])
    presets = json.loads(capsys.readouterr().out)["presets"]
    found = {name: (entry["best_budget_on_validation"], entry["best_budget_at_edge_of_grid"])
             for name, entry in presets.items()}
    assert found == {"up": (40, "largest"), "down": (10, "smallest"), "mid": (20, None), "one": (10, None)}
    assert all(entry["budget"] is None for entry in presets.values())  # no final run yet


def test_final_runs_wait_for_every_select_run_of_their_preset(tmp_path):
    """Side by side, a final run must not start on a budget chosen before every select seed has scored it."""
    args = argparse.Namespace(results=str(tmp_path), phase="all", presets=["p", "q"], budgets=[1, 2],
                              select_seeds=[0, 1], seeds=[0, 1])

    def write(phase, preset, epochs, seed, **fields):
        _write(str(tmp_path), dict(phase=phase, preset=preset, epochs=epochs, seed=seed, **fields))

    jobs, waiting = gpu_presets._ready_jobs(args)
    assert jobs == [("select", p, e, s) for p in "pq" for e in (1, 2) for s in (0, 1)] and waiting == ["p", "q"]
    for epochs, seed, score in ((1, 0, 0.9), (2, 0, 0.8), (1, 1, 0.7)):
        write("select", "p", epochs, seed, validation_score=score)
    jobs, waiting = gpu_presets._ready_jobs(args)  # p's budget 2 lacks seed 1: its final runs wait
    assert ("select", "p", 2, 1) in jobs and not any(job[0] == "final" for job in jobs) and waiting == ["p", "q"]
    write("select", "p", 2, 1, validation_score=0.9)  # means: e1 0.80, e2 0.85
    write("final", "p", 2, 0, metrics={})
    jobs, waiting = gpu_presets._ready_jobs(args)
    assert jobs[-1] == ("final", "p", 2, 1) and [job[0] for job in jobs].count("final") == 1 and waiting == ["q"]


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


# On PYTHONPATH, this folder's sitecustomize makes ``import tensorflow`` fail in the protocol's process and in the
# worker processes it starts, as on the GPU machine.
WITHOUT_TENSORFLOW = os.path.join(ROOT, "tests", "backends", "without_tensorflow_site")


@pytest.mark.fashion_mnist
def test_a_slice_smaller_than_one_batch_names_limit():
    """384 images leave 118 of the retrieval preset's seen classes for training, fewer than its batch of 128: one
    line naming ``limit``, before a model is built (``fit`` would otherwise find no batch)."""
    from training.data.errors import EmptySliceError

    with pytest.raises(EmptySliceError, match=r"`limit` 384: 118 training images .* fewer than one batch of 128"):
        gpu_presets.validation_score("resnet20_gsp_retrieval_fashion_mnist", 1, 0, limit=384)


@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_a_validation_run_logs_the_heads_signals_beside_its_losses(tmp_path):
    """A select run of the MPW preset logs its head's Sinkhorn iterations and marginal error every epoch into
    ``log.csv``, in the rows of the losses the run returns."""
    from explain.signals import read_training_log

    run_dir = tmp_path / "run"
    _, losses = gpu_presets.validation_score("resnet20_mpw_fashion_mnist", 1, 0, limit=384, run_dir=str(run_dir),
                                             verbose=0)
    log = read_training_log(str(run_dir / "log.csv"))
    assert log["loss"].round(4).tolist() == losses and len(losses) == 1
    assert log["mpw_head_sinkhorn_iterations"][0] >= 1 and np.isfinite(log["mpw_head_marginal_error"][0])


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_the_protocol_runs_without_tensorflow_and_resumes(tmp_path):
    pytest.importorskip("jax")
    results, runs = str(tmp_path / "results"), str(tmp_path / "runs")
    preset = "resnet20_gap_fashion_mnist"
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=os.pathsep.join([WITHOUT_TENSORFLOW, ROOT]),
               TF_CPP_MIN_LOG_LEVEL="3")
    blocked = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True, text=True, env=env)
    assert "blocked by this check" in blocked.stderr

    def call(*args):
        proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env,
                              cwd=str(tmp_path), timeout=1200)
        assert proc.returncode == 0, proc.stderr[-3000:]
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
    for record in records:  # each run's last logged epoch, kept in its record (only seed 0's directory is shipped)
        if record["phase"] == "select":
            assert record["last_epoch"]["loss"] == pytest.approx(record["loss"][-1], abs=1e-4)
        else:
            with open(os.path.join(record["out_dir"], "log.csv")) as handle:
                last_row = list(csv.DictReader(handle))[-1]
            assert record["last_epoch"] == {k: pytest.approx(float(v), abs=1e-6) for k, v in last_row.items()
                                            if k != "epoch"}
    again = call("run", *options)
    assert "e1 s0:" not in again and len(gpu_presets.read_records(results)) == len(records)  # every run skipped
    call("report", "--results", results, "--output", str(tmp_path / "report.json"))
    with open(tmp_path / "report.json") as handle:
        summary = json.load(handle)["presets"][preset]
    assert summary["accuracy"]["mean"] == pytest.approx(np.mean([card["metrics"]["accuracy"] for card in cards]))
    call("ship", "--results", results, "--runs", runs, "--to", str(tmp_path / "presets"), "--presets", preset)
    with open(tmp_path / "presets" / preset / "metadata.json") as handle:
        shipped = json.load(handle)
    seed_0 = next(card for card in cards if card["recipe"]["seed"] == 0)
    assert shipped["weights_sha256"] == seed_0["weights_sha256"] and shipped["protocol"]["seeds"] == [0, 1]

    # The same protocol stopped after every epoch (a time limit of 0: each call trains one epoch), each call resuming
    # the unfinished run from its backup, ends where the uninterrupted calls did: same losses, scores and weights.
    budget = finals[0]["epochs"]
    reference = {(r["phase"], r["epochs"], r["seed"]): r for r in records}
    common = options[4:options.index("--seeds")] + ["--limit", "384", "--time-limit", "0"]
    resumed = _calls_until_done(call, ["--results", str(tmp_path / "results_1"), "--runs", str(tmp_path / "runs_1"),
                                       "--seeds", "0"] + common, expected_calls=3 + budget)
    # select e1, e2 (two calls), final seed 0 (budget calls)
    assert sorted(resumed) == sorted(key for key in reference if key[2] == 0)
    # Two workers: select e1 and e2 side by side, then e2's second epoch, then both seeds' final runs side by side.
    beside = _calls_until_done(call, ["--results", str(tmp_path / "results_2"), "--runs", str(tmp_path / "runs_2"),
                                      "--seeds", "0", "1", "--workers", "2"] + common, expected_calls=2 + budget)
    assert sorted(beside) == sorted(reference)
    for records_of_calls in (resumed, beside):
        for key, record in records_of_calls.items():
            for field in ("validation_score", "loss", "metrics"):  # 4 digits: a last digit may round either way
                expected = reference[key].get(field)
                assert record.get(field) == (expected if expected is None else pytest.approx(expected, abs=2e-4)), \
                    (key, field)
            if key[0] == "final":
                _assert_same_h5(os.path.join(reference[key]["out_dir"], "model.weights.h5"),
                                os.path.join(record["out_dir"], "model.weights.h5"))
        assert records_of_calls[("select", 2, 0)]["resumed_at_epoch"] == 1
    for runs in ("runs_1", "runs_2"):
        assert not glob.glob(str(tmp_path / runs / "*" / "backup"))  # every finished run's backup is gone
        assert not glob.glob(str(tmp_path / runs / "*" / gpu_presets.RUN_MARKER))  # and its mark


def _calls_until_done(call, options, expected_calls):
    """Call the protocol's run until a call meets no time limit; its records by (phase, epochs, seed)."""
    outputs = [call("run", *options)]
    while "time limit" in outputs[-1]:
        assert len(outputs) < 8, outputs[-1]
        outputs.append(call("run", *options))
    assert len(outputs) == expected_calls, outputs
    results = options[options.index("--results") + 1]
    return {(r["phase"], r["epochs"], r["seed"]): r for r in gpu_presets.read_records(results)}


def _assert_same_h5(a, b):
    first, second = weights_file_arrays(a), weights_file_arrays(b)
    assert sorted(first) == sorted(second) and first
    for name in first:
        np.testing.assert_allclose(second[name], first[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_a_backup_resumes_only_into_the_run_it_was_made_for(tmp_path):
    """A final run's directory is named by preset and seed; its budget is chosen later, and a grid widened since a
    backup was made may choose another. Only a backup marked as the same run (budget and slice included) is kept."""
    path = str(tmp_path / "resnet20_mpw_fashion_mnist-seed0")
    backup = os.path.join(path, "backup", "latest")

    def prepare(epochs, limit=None):
        job = ("final", "resnet20_mpw_fashion_mnist", epochs, 0)
        assert gpu_presets._prepared_run_dir(str(tmp_path), job, limit) == path
        with open(os.path.join(path, gpu_presets.RUN_MARKER)) as handle:
            assert json.load(handle) == dict(phase="final", preset=job[1], epochs=epochs, seed=0, limit=limit)
        return os.path.exists(backup)

    def back_up():
        os.makedirs(os.path.dirname(backup), exist_ok=True)
        open(backup, "w").close()

    assert not prepare(60)  # a new run: its directory made and marked
    back_up()
    assert prepare(60)  # the same run: resumed
    assert not prepare(10)  # the budget changed: the 60-epoch backup is discarded
    back_up()
    assert not prepare(10, limit=384)  # another slice
    back_up()
    os.remove(os.path.join(path, gpu_presets.RUN_MARKER))
    assert not prepare(10)  # a backup of unknown origin
    open(os.path.join(path, "log.csv"), "w").close()
    assert not prepare(10) and not os.path.exists(os.path.join(path, "log.csv"))  # no backup: the run starts again


def _finished_run(runs, preset, seed, epochs, backend):
    """A finished final run's directory made from the packaged preset (its card relabelled as ``seed``'s run of
    ``epochs`` epochs on ``backend``); returns the card's metrics."""
    run_dir = os.path.join(runs, f"{preset}-seed{seed}")
    source = os.path.join(ROOT, "zoo", "presets", preset)
    os.makedirs(run_dir)
    for name in ("config.json", "model.weights.h5"):
        shutil.copy(os.path.join(source, name), run_dir)
    shutil.copy(os.path.join(source, "train_log.csv"), os.path.join(run_dir, "log.csv"))
    with open(os.path.join(source, "metadata.json")) as handle:
        card = json.load(handle)
    card["recipe"].update(epochs=epochs, seed=seed)
    card["backend"] = backend
    with open(os.path.join(run_dir, "metadata.json"), "w") as handle:
        json.dump(card, handle)
    return card["metrics"]


def test_ship_copies_the_checked_seed_0_run_with_the_seeds_summary_on_its_card(tmp_path):
    preset = "resnet20_gap_fashion_mnist"
    results, runs, to = (str(tmp_path / name) for name in ("results", "runs", "presets"))
    os.makedirs(results)
    metrics = _finished_run(runs, preset, 0, 10, "jax")
    accuracies = [metrics["accuracy"], 0.9402, 0.9377]
    for epochs, score in ((5, 0.91), (10, 0.93)):
        _write(results, _select(preset, epochs, 0, score))
    for seed, accuracy in enumerate(accuracies):
        _write(results, _final(preset, 10, seed, dict(accuracy=accuracy)))
    options = ["ship", "--results", results, "--runs", runs, "--to", to, "--presets", preset]
    assert gpu_presets.main(options) == 0
    shipped = os.path.join(to, preset)
    assert sorted(os.listdir(shipped)) == ["config.json", "metadata.json", "model.weights.h5", "train_log.csv"]
    with open(os.path.join(shipped, "metadata.json")) as handle:
        protocol = json.load(handle)["protocol"]
    assert protocol["budget"] == 10 and protocol["seeds"] == [0, 1, 2]
    assert protocol["validation_by_budget"] == {"5": 0.91, "10": 0.93}
    assert protocol["accuracy"]["mean"] == pytest.approx(np.mean(accuracies))
    assert protocol["accuracy"]["sd"] == pytest.approx(np.std(accuracies, ddof=1))
    from zoo.preset_format import load_preset

    assert load_preset(shipped).count_params() > 0  # the card's sha256 is checked before the weights load

    # A run that is not the one its record names is refused in one line naming --runs.
    _write(results, _final(preset, 10, 0, dict(accuracy=0.5)))
    with pytest.raises(SystemExit, match="`--runs`.*not the finished run"):
        gpu_presets.main(options)
    _write(results, _final(preset, 10, 0, metrics))
    os.makedirs(os.path.join(runs, f"{preset}-seed0", "backup"))
    with pytest.raises(SystemExit, match="unfinished: backup"):
        gpu_presets.main(options)
    os.rmdir(os.path.join(runs, f"{preset}-seed0", "backup"))
    with open(os.path.join(runs, f"{preset}-seed0", "model.weights.h5"), "ab") as handle:
        handle.write(b"0")
    with pytest.raises(SystemExit, match="`--runs`.*does not match its card"):
        gpu_presets.main(options)


def test_ship_again_brings_a_shipped_cards_protocol_up_to_the_seeds_recorded_since(tmp_path):
    """A lease is shorter than the seeds take: seed 0 is shipped once it is done, its run directory is gone by the
    time the other seeds are recorded, and a later ``ship`` updates the shipped card's ``protocol`` only."""
    preset = "resnet20_gap_fashion_mnist"
    results, runs, to = (str(tmp_path / name) for name in ("results", "runs", "presets"))
    os.makedirs(results)
    metrics = _finished_run(runs, preset, 0, 10, "jax")
    _write(results, _select(preset, 10, 0, 0.93))
    _write(results, _final(preset, 10, 0, metrics))
    options = ["ship", "--results", results, "--runs", runs, "--to", to, "--presets", preset]
    assert gpu_presets.main(options) == 0
    shipped = os.path.join(to, preset)
    with open(os.path.join(shipped, "model.weights.h5"), "rb") as handle:
        weights = handle.read()
    with open(os.path.join(shipped, "metadata.json")) as handle:
        assert json.load(handle)["protocol"]["seeds"] == [0]

    shutil.rmtree(runs)
    accuracies = [metrics["accuracy"], 0.9402, 0.9377]
    for seed, accuracy in enumerate(accuracies[1:], start=1):
        _write(results, _final(preset, 10, seed, dict(accuracy=accuracy)))
    assert gpu_presets.main(options) == 0
    with open(os.path.join(shipped, "metadata.json")) as handle:
        card = json.load(handle)
    assert card["protocol"]["seeds"] == [0, 1, 2] and card["metrics"] == metrics
    assert card["protocol"]["accuracy"]["sd"] == pytest.approx(np.std(accuracies, ddof=1))
    with open(os.path.join(shipped, "model.weights.h5"), "rb") as handle:
        assert handle.read() == weights
    assert sorted(os.listdir(shipped)) == ["config.json", "metadata.json", "model.weights.h5", "train_log.csv"]

    # Without the run directory, a shipped preset that is another run (here: another seed 0 recorded) is refused.
    _write(results, _final(preset, 10, 0, dict(accuracy=0.5)))
    with pytest.raises(SystemExit, match="`--runs`.*holds no card"):
        gpu_presets.main(options)


def test_final_runs_go_seed_by_seed_with_the_compared_presets_first(tmp_path):
    """A lease that ends early must leave both sides of a comparison with as many seeds: the final runs are started
    seed by seed, and the preset outside every comparison (the hyperspherical one) after the compared ones."""
    presets = list(gpu_presets.PRESETS)
    args = argparse.Namespace(results=str(tmp_path), phase="all", presets=presets, budgets=[1], select_seeds=[0],
                              seeds=[0, 1])
    for preset in presets:
        _write(str(tmp_path), _select(preset, 1, 0, 0.5))
    jobs, waiting = gpu_presets._ready_jobs(args)
    assert waiting == [] and all(job[0] == "final" for job in jobs) and len(jobs) == 2 * len(presets)
    compared = {name for comparison in gpu_presets.COMPARISONS for name in comparison[:2]}
    outside = [preset for preset in presets if preset not in compared]
    assert outside == ["resnet20_hyperspherical_fashion_mnist"]
    order = [(job[1], job[3]) for job in jobs]
    first_seed = [preset for preset, seed in order[:len(compared)]]
    assert sorted(first_seed) == sorted(compared) and all(seed == 0 for _, seed in order[:len(compared)])
    assert all(seed == 1 for _, seed in order[len(compared):2 * len(compared)])
    assert order[-2:] == [(outside[0], 0), (outside[0], 1)]


def test_the_report_tables_give_mean_sd_and_welch_test_of_the_final_runs(tmp_path, capsys):
    from scipy import stats
    mpw, gap = [0.951, 0.948, 0.953], [0.944, 0.949, 0.946, 0.947]
    records = [_select(p, e, 0, score) for p in ("resnet20_mpw_fashion_mnist", "resnet20_gap_fashion_mnist")
               for e, score in ((15, 0.93), (60, 0.94))]
    records += [_final(preset, 60, seed, {"accuracy": value})
                for preset, values in (("resnet20_mpw_fashion_mnist", mpw), ("resnet20_gap_fashion_mnist", gap))
                for seed, value in enumerate(values)]
    iterations = [12.0, 9.0]  # MPW seeds 0 and 1 recorded their last epoch; seed 2 (an older record) did not
    for record, count in zip(records[4:6], iterations):
        record["last_epoch"] = {"loss": 0.2, "mpw_head_sinkhorn_iterations": count}
    for record in records:
        _write(str(tmp_path), record)
    table = tmp_path / "seeds.md"
    gpu_presets.main(["report", "--results", str(tmp_path), "--markdown", str(table)])
    summary = json.loads(capsys.readouterr().out)
    (comparison,) = summary["comparisons"]
    expected = stats.ttest_ind(mpw, gap, equal_var=False)
    assert comparison["welch_t"] == pytest.approx(expected.statistic)
    assert comparison["p_value"] == pytest.approx(expected.pvalue)
    text = table.read_text()
    assert f"accuracy {np.mean(mpw):.4f} ± {np.std(mpw, ddof=1):.4f}" in text
    assert "| resnet20_mpw_fashion_mnist | 60 (largest of the grid) | 3 |" in text
    assert f"| {np.mean(mpw) - np.mean(gap):+.4f} | {expected.statistic:.2f} | {expected.pvalue:.3g} | 3 vs 4 |" in text
    last = summary["presets"]["resnet20_mpw_fashion_mnist"]["last_epoch"]
    assert last["seeds"] == 2 and last["mpw_head_sinkhorn_iterations"]["values"] == iterations
    assert (f"| resnet20_mpw_fashion_mnist | 2 | loss 0.2000 ± 0.0000, mpw_head_sinkhorn_iterations "
            f"{np.mean(iterations):.4f} ± {np.std(iterations, ddof=1):.4f} |") in text
    assert summary["presets"]["resnet20_gap_fashion_mnist"]["last_epoch"] == {"seeds": 0}
