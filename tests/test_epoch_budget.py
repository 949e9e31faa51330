"""``experiments/epoch_budget.py``: the budget chosen on validation scores only, the paired comparison at each
variant's own budget (against scipy's paired t-test), BatchNorm recalibration (against numpy's batch moments) and
the scoring that puts the model's statistics back."""
import os
import sys

import keras
import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import epoch_budget  # noqa: E402


def _run(variant, seed, validation, test):
    return {"variant": variant, "seed": seed, "validation": validation, "test": test}


def test_chosen_epoch_reads_validation_only_and_takes_the_smaller_on_a_tie():
    runs = [_run("a", 0, [0.5, 0.7, 0.6], [0.1, 0.2, 0.9]), _run("a", 1, [0.6, 0.6, 0.7], [0.1, 0.2, 0.9])]
    assert epoch_budget.chosen_epoch(runs, "validation") == 2  # means 0.55, 0.65, 0.65: the tie goes to 2
    assert epoch_budget.chosen_epoch(runs, "test") == 3


def test_budget_comparison_reads_each_variant_at_its_own_budget_and_pairs_by_seed():
    rng = np.random.default_rng(0)
    runs = []
    for seed in range(4):
        runs.append(_run("a", seed, [0.1, 0.9, 0.2], rng.uniform(size=3).tolist()))
        runs.append(_run("b", seed, [0.1, 0.2, 0.9], rng.uniform(size=3).tolist()))
    runs.append(_run("a", 9, [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]))  # a seed left out of the comparison
    summary, paired = epoch_budget.budget_comparison(runs, [0, 1, 2, 3], "variant", ("a", "b"), "validation", "test",
                                                     also=["validation"])
    a_test = [r["test"][1] for r in runs[:8] if r["variant"] == "a"]
    b_test = [r["test"][2] for r in runs[:8] if r["variant"] == "b"]
    assert (summary["a"]["epochs"], summary["b"]["epochs"]) == (2, 3)
    assert summary["a"]["test"] == a_test and summary["b"]["test"] == b_test
    assert summary["a"]["validation"] == [0.9] * 4 and summary["a"]["validation_mean"] == pytest.approx(0.9)
    assert summary["b"]["test_sd"] == pytest.approx(np.std(b_test, ddof=1))
    assert paired["mean"] == pytest.approx(np.mean(np.subtract(a_test, b_test)))
    assert paired["paired_t_p"] == pytest.approx(stats.ttest_rel(a_test, b_test).pvalue)


def test_complete_seeds_needs_every_variant():
    runs = [_run("a", 0, [], []), _run("b", 0, [], []), _run("a", 1, [], []), _run("b", 2, [], [])]
    assert epoch_budget.complete_seeds(runs, "variant", ("a", "b")) == [0]


def _batchnorm_model():
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, name="dense")(inputs)
    model = keras.Model(inputs, keras.layers.BatchNormalization(momentum=0.9, name="bn")(hidden))
    model.get_layer("dense").set_weights([np.arange(12, dtype="float32").reshape(3, 4) / 10,
                                          np.ones(4, dtype="float32")])
    return model


def test_recalibrate_sets_the_batch_moments_and_keeps_the_momentum():
    model = _batchnorm_model()
    images = np.random.default_rng(1).normal(size=(64, 3)).astype("float32")
    hidden = images @ model.get_layer("dense").get_weights()[0] + 1.0
    epoch_budget.recalibrate(model, images)
    norm = model.get_layer("bn")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(norm.moving_mean), hidden.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(norm.moving_variance), hidden.var(axis=0), rtol=1e-4)
    assert norm.momentum == 0.9


def test_score_recalibrated_scores_the_recalibrated_model_and_puts_the_statistics_back():
    model = _batchnorm_model()
    images = np.random.default_rng(2).normal(size=(32, 3)).astype("float32")
    before = [keras.ops.convert_to_numpy(v) for v in model.non_trainable_variables]
    scored = epoch_budget.score_recalibrated(model, images, lambda: model.predict(images, verbose=0))
    np.testing.assert_allclose(scored.mean(axis=0), 0.0, atol=1e-4)  # normalized by the images' own moments
    with pytest.raises(RuntimeError, match="scoring failed"):
        epoch_budget.score_recalibrated(model, images, lambda: (_ for _ in ()).throw(RuntimeError("scoring failed")))
    for variable, value in zip(model.non_trainable_variables, before):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), value)


def test_recorded_runs_refuses_another_configuration(tmp_path):
    path = str(tmp_path / "runs.json")
    assert epoch_budget.recorded_runs(path, {"epochs": 2}) == []
    epoch_budget.write_json(path, {"config": {"epochs": 2}, "runs": [{"seed": 0}]})
    assert epoch_budget.recorded_runs(path, {"epochs": 2}) == [{"seed": 0}]
    with pytest.raises(ValueError, match="runs.json holds runs of another configuration"):
        epoch_budget.recorded_runs(path, {"epochs": 3})


def test_train_missing_trains_only_the_missing_runs_and_writes_after_each(capsys):
    runs = [{"variant": "a", "seed": 0}]
    trained, written = [], []

    def train_one(variant, seed):
        trained.append((variant, seed))
        return {"variant": variant, "seed": seed}

    def write(runs):
        written.append(len(runs))
        return {"runs": len(runs)}

    report = epoch_budget.train_missing(runs, [0, 1], "variant", ("a", "b"), train_one, write)
    assert trained == [("b", 0), ("a", 1), ("b", 1)] and written == [2, 3, 4] and report == {"runs": 4}
    assert capsys.readouterr().out.splitlines()[0] == '{"variant": "b", "seed": 0}'
    assert epoch_budget.train_missing(runs, [0, 1], "variant", ("a", "b"), train_one, write) == {"runs": 4}
    assert len(trained) == 3 and written == [2, 3, 4, 4]
