"""``experiments/gsp_epsilon_choice.py``: GSP's epsilon and budget are chosen together on validation scores only, GAP
is read from one report, the comparison is paired by seed (against scipy's paired t-test), and reports that do not
fit together are refused with a line naming them."""
import json
import os
import sys

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import gsp_epsilon_choice  # noqa: E402

CONFIG = {"epochs": 3, "steps_per_epoch": 75, "train_per_class": 6000, "validation_per_class": 1000}


def _run(variant, seed, validation, test):
    return {"variant": variant, "seed": seed, "validation_map_at_r": validation, "test_map_at_r": test,
            "test_precision_at_1": [2 * v for v in test]}


def _write(folder, name, epsilon, runs, **config):
    path = folder / name
    path.write_text(json.dumps({"config": {**CONFIG, **config, "epsilon": epsilon}, "runs": runs}))
    return str(path)


def _write_text(path, text):
    path.write_text(text)
    return str(path)


def _reports(folder):
    """epsilon 0.1 with both poolings; 0.3 best on validation (epoch 2) but not on test; 1.0 best on test."""
    rng = np.random.default_rng(0)
    base, middle, large = [], [], []
    for seed in range(4):
        base += [_run("gsp", seed, [0.2, 0.3, 0.25], rng.uniform(size=3).tolist()),
                 _run("gap", seed, [0.1, 0.2, 0.4], rng.uniform(size=3).tolist())]
        middle.append(_run("gsp", seed, [0.3, 0.5, 0.1], rng.uniform(0, 0.5, size=3).tolist()))
        large.append(_run("gsp", seed, [0.45, 0.1, 0.1], [0.9, 0.9, 0.9]))
    middle.append(_run("gsp", 7, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]))  # a seed the others lack: left out
    large.append(_run("gap", 0, [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]))  # a later report's GAP run: not read
    return [_write(folder, "base.json", 0.1, base), _write(folder, "middle.json", 0.3, middle),
            _write(folder, "large.json", 1.0, large)], base, middle


def test_epsilon_and_budget_are_chosen_on_validation_and_compared_with_gap_by_seed(tmp_path):
    paths, base, middle = _reports(tmp_path)
    config, runs = gsp_epsilon_choice.read_reports(paths)
    assert config == CONFIG
    seeds = gsp_epsilon_choice.complete_seeds(runs, "setting", {r["setting"] for r in runs})
    assert seeds == [0, 1, 2, 3]
    result = gsp_epsilon_choice.choose(runs, seeds)
    assert result["chosen_epsilon"] == 0.3
    assert [row["epsilon"] for row in result["epsilons"]] == [0.1, 0.3, 1.0]
    assert [row["gsp"]["epochs"] for row in result["epsilons"]] == [2, 2, 1]
    gsp_test = [r["test_map_at_r"][1] for r in middle[:4]]
    gap_test = [r["test_map_at_r"][2] for r in base if r["variant"] == "gap"]
    assert result["poolings"]["gsp"]["test"] == gsp_test
    assert result["poolings"]["gap"]["test"] == gap_test and result["poolings"]["gap"]["epochs"] == 3
    assert result["gsp_minus_gap"]["mean"] == pytest.approx(np.mean(np.subtract(gsp_test, gap_test)))
    assert result["gsp_minus_gap"]["paired_t_p"] == pytest.approx(stats.ttest_rel(gsp_test, gap_test).pvalue)
    assert result["epsilons"][2]["gsp"]["test_mean"] == pytest.approx(0.9)  # reported, not chosen
    assert result["poolings"]["gsp"]["test_precision_at_1_mean"] == pytest.approx(2 * np.mean(gsp_test))


def test_a_tie_goes_to_the_epsilon_listed_first(tmp_path):
    runs = [_run("gsp", 0, [0.5], [0.1]), _run("gap", 0, [0.5], [0.2])]
    first = _write(tmp_path, "a.json", 1.0, runs, epochs=1)
    second = _write(tmp_path, "b.json", 0.3, [_run("gsp", 0, [0.5], [0.9])], epochs=1)
    _, runs = gsp_epsilon_choice.read_reports([first, second])
    assert gsp_epsilon_choice.choose(runs, [0])["chosen_epsilon"] == 1.0


@pytest.mark.parametrize("case, message", [
    ("other_config", "another configuration"),
    ("repeated", "repeats epsilon 0.1"),
    ("no_gap", "none of the reports holds GAP runs"),
    ("not_a_report", "not a report of gsp_vs_gap.py"),
])
def test_reports_that_do_not_fit_are_refused(tmp_path, case, message):
    gsp, gap = _run("gsp", 0, [0.5], [0.1]), _run("gap", 0, [0.5], [0.2])
    first = _write(tmp_path, "a.json", 0.1, [gsp] if case == "no_gap" else [gsp, gap])
    second = {"other_config": lambda: _write(tmp_path, "b.json", 0.3, [gsp], steps_per_epoch=375),
              "repeated": lambda: _write(tmp_path, "b.json", 0.1, [gsp]),
              "no_gap": lambda: _write(tmp_path, "b.json", 0.3, [gsp]),
              "not_a_report": lambda: _write_text(tmp_path / "b.json", "{}")}[case]()
    with pytest.raises(ValueError, match=message):
        gsp_epsilon_choice.read_reports([first, second])


def test_the_command_line_names_the_argument_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["gsp_epsilon_choice.py", str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit) as stop:
        gsp_epsilon_choice.main()
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"reports: no such file: {tmp_path / 'missing.json'}")


def test_the_command_line_writes_the_comparison(tmp_path, monkeypatch, capsys):
    paths, _, _ = _reports(tmp_path)
    out = tmp_path / "choice.json"
    monkeypatch.setattr(sys, "argv", ["gsp_epsilon_choice.py", *paths, "--out", str(out)])
    gsp_epsilon_choice.main()
    written = json.loads(out.read_text())
    assert written["seeds"] == [0, 1, 2, 3] and list(written["summary"]) == ["moving"]
    assert written["summary"]["moving"]["chosen_epsilon"] == 0.3
    assert "moving: chosen epsilon 0.3" in capsys.readouterr().out
