"""``experiments/gsp_selectivity.py``: the selectivity numbers on weights whose values are known in closed form, the
pooling weights read from a model, which tend to global average pooling's ``1/n`` as epsilon grows, and a grown
epsilon grid retrained only at its new epsilons."""
import json
import os
import sys

import keras
import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments"))
import gsp_selectivity  # noqa: E402
from ot_layers import GeneralizedSumPooling  # noqa: E402


def test_selectivity_of_uniform_even_and_one_hot_weights():
    n = 8
    weights = np.array([np.full(n, 1 / n),                       # uniform: every position, a quarter of the mass
                        np.r_[np.full(2, 0.5), np.zeros(n - 2)],  # even over 2 of 8 positions, both in the top quarter
                        np.eye(n)[3],                             # one position
                        np.r_[np.full(4, 0.2), np.full(4, 0.05)]])
    share, top_quarter = gsp_selectivity.selectivity(weights)
    np.testing.assert_allclose(share, [1.0, 2 / n, 1 / n, 1 / (n * (4 * 0.04 + 4 * 0.0025))])
    np.testing.assert_allclose(top_quarter, [0.25, 1.0, 1.0, 0.4])


def _model(epsilon):
    keras.utils.set_random_seed(0)  # the convolution's initial weights
    inputs = keras.Input((4, 5, 3))
    features = keras.layers.Conv2D(6, 1, name="features")(inputs)
    pooled = GeneralizedSumPooling(num_prototypes=4, transport_ratio=0.3, epsilon=epsilon, name="gsp")(features)
    model = keras.Model(inputs, pooled)
    model.get_layer("gsp").prototypes.assign(np.random.default_rng(1).normal(size=(4, 6)).astype("float32"))
    return model


@pytest.mark.parametrize("epsilon", [1e4, 0.01])
def test_pooling_weights_of_a_model_sum_to_one_and_tend_to_uniform(epsilon):
    images = np.random.default_rng(0).normal(size=(7, 4, 5, 3)).astype("float32")
    weights, grid = gsp_selectivity.pooling_weights(_model(epsilon), images, batch_size=3)  # three chunks
    assert weights.shape == (7, 20) and tuple(grid) == (4, 5)
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-5)
    share, _ = gsp_selectivity.selectivity(weights)
    if epsilon > 1:
        np.testing.assert_allclose(weights, 1 / 20, rtol=1e-3)  # the GAP limit
    else:
        # every weight is at most 1 / (mu n), so the share is at least mu = 0.3; a sharp transport is close to it
        assert share.min() >= 0.3 - 1e-4 and share.max() < 0.4


def test_object_overlap_of_a_box_on_cells():
    offsets = np.array([[4, 8], [2, 6], [0, 0]])
    overlap = gsp_selectivity.object_overlap(offsets, (4, 4), 16, (4, 4))  # 4x4 cells of 4x4 pixels
    assert overlap.shape == (3, 16)
    np.testing.assert_array_equal(overlap[0], np.eye(16)[1 * 4 + 2])  # the box is the cell (1, 2)
    # a box straddling four cells: half of two rows x half of two columns
    expected = np.zeros((4, 4))
    expected[0:2, 1:3] = 0.25
    np.testing.assert_array_equal(overlap[1].reshape(4, 4), expected)
    # GAP's weights put the box's share of the canvas on it, wherever it is
    boxes = np.random.default_rng(0).integers(0, 40 - 28 + 1, size=(50, 2))
    uniform = gsp_selectivity.object_overlap(boxes, (28, 28), 40, (10, 10)).mean(axis=1)
    np.testing.assert_allclose(uniform, 28 * 28 / 40 ** 2)
    with pytest.raises(ValueError, match="do not tile"):
        gsp_selectivity.object_overlap(offsets, (4, 4), 16, (3, 4))


def test_a_grown_epsilon_grid_retrains_only_the_new_epsilon(tmp_path, monkeypatch, capsys):
    choice = {"config": {"train_per_class": 10, "validation_per_class": 10, "steps_per_epoch": 2},
              "seeds": [0, 1],
              "summary": {"moving": {"epsilons": [{"epsilon": 0.1, "gsp": {"epochs": 5, "test": [0.3, 0.4]}},
                                                  {"epsilon": 0.03, "gsp": {"epochs": 7, "test": [0.5, 0.6]}}]}}}
    choice_path, out = str(tmp_path / "choice.json"), str(tmp_path / "selectivity.json")
    with open(choice_path, "w") as handle:
        json.dump(choice, handle)
    measured = {"epsilon": 0.1, "epochs": 5, "effective_share_mean": 0.5}
    with open(out, "w") as handle:
        json.dump({"choice": choice_path, "seed": 1, "epsilons": [measured]}, handle)
    # an earlier call for another seed, another choice or another budget is not reused
    assert gsp_selectivity.measured_rows(out, choice_path, 0) == {}
    assert gsp_selectivity.measured_rows(out, "other.json", 1) == {}
    assert gsp_selectivity.measured_rows(str(tmp_path / "none.json"), choice_path, 1) == {}
    assert gsp_selectivity.measured_rows(out, choice_path, 1) == {(0.1, 5): measured}

    trained = []

    class Trained(Exception):
        pass

    def train_model(variant, seed, train, validation, test, epochs, *rest):
        trained.append((variant, seed, epochs))
        raise Trained
    monkeypatch.setattr(gsp_selectivity, "load_splits", lambda *sizes: (None, None, None))
    monkeypatch.setattr(gsp_selectivity, "train_model", train_model)
    monkeypatch.setattr(sys, "argv", ["gsp_selectivity.py", "--choice", choice_path, "--seed", "1", "--out", out])
    with pytest.raises(Trained):
        gsp_selectivity.main()
    assert trained == [("gsp", 1, 7)]  # epsilon 0.1 at 5 epochs was kept, 0.03 is trained
    assert "kept epsilon 0.1 (5 epochs)" in capsys.readouterr().out
