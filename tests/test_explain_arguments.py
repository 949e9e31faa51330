"""What the explanation functions refuse, before the model runs or a file is written: labels outside the model's
classes (a label of -1 drew the last class's plans, titled "true: -1"), fractional labels (truncated), episode
support labels that are not ``0..ways-1`` each with an image (a class without support got logit 0 and the images
of label ``ways`` were dropped), assignments that are no permutation, ``exclude`` entries that are not one gallery
index per query, repeated image names (one file overwritten), a string of class names (read letter by letter),
an unwritable path or a resolution beyond print quality (found after the work), and a default ``explain_model``
that drew some kinds, then failed on one whose inputs were not given. Also the solvers' edge cases found beside
them: greedy k-center's repeated indices when fewer points than ``k`` are distinct, and partial transport reported
converged after losing its precision."""
import os

import numpy as np
import pytest

import explain
import zoo
from ot_layers.solvers import greedy_k_center, partial_transport

SMALL = dict(width=8, feature_dim=16)


def _images(count, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (count, 28, 28, 1)).astype(np.uint8)


@pytest.fixture(scope="module")
def mpw_model():
    return zoo.image_classifier("small_convnet", "mpw", 4, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                                head_kwargs=dict(num_proxies=3))


@pytest.mark.parametrize("kwargs, message", [
    (dict(label=-1), r"^`label` must be a class of the model, in 0..3, got -1"),
    (dict(label=4), r"^`label` must be a class of the model, in 0..3, got 4"),
    (dict(label=1.7), r"^`label` must be an integer class label, got 1.7"),
    (dict(label="b"), r"^`label` must be an integer class label"),
    (dict(class_names="abcd"), "^`class_names` must be a sequence of names"),
    (dict(class_names=["a"]), r"^`class_names` has 1 names for 4 classes"),
    (dict(dpi=601), "^`dpi` must be an integer <= 600"),
])
def test_mpw_plot_arguments(mpw_model, kwargs, message, tmp_path):
    path = tmp_path / "mpw.png"
    with pytest.raises(ValueError, match=message):
        explain.plot_mpw_plans(mpw_model, _images(1)[0], str(path), **kwargs)
    assert not path.exists()


def test_a_path_that_cannot_be_written_is_named_before_the_model_runs(mpw_model, tmp_path):
    (tmp_path / "file").write_text("x")
    for path, message in ((str(tmp_path), "is a directory"), (str(tmp_path / "file" / "a.png"), "is below the file"),
                          (None, "must be a file path"), ("", "is empty")):
        with pytest.raises(ValueError, match=f"^`path` .*{message}"):
            explain.plot_mpw_plans(mpw_model, _images(1)[0], path)
    for name in ("plans.jpg", "plans.svg"):  # PNG bytes were written under any extension
        with pytest.raises(ValueError, match=rf"^`path` must name a PNG file .*'{tmp_path / name}'"):
            explain.plot_mpw_plans(mpw_model, _images(1)[0], str(tmp_path / name))
        assert not (tmp_path / name).exists()
    assert explain.plot_mpw_plans(mpw_model, _images(1)[0], str(tmp_path / "plans.PNG")).endswith(".PNG")


@pytest.mark.parametrize("labels, message", [
    ([1, 2, 3, 1, 2, 3], r"must be the episode labels 0..2, each with a support image"),  # 1-based
    ([0, 0, 1, 1, 0, 1], r"must be the episode labels 0..2, each with a support image"),  # class 2 without
    ([0, 1, 2.5, 0, 1, 2], r"must be episode labels 0..ways-1"),
])
def test_emd_support_labels_must_be_the_episode_labels(labels, message, tmp_path):
    model = zoo.few_shot_model("small_convnet", "emd", ways=3, input_shape=(28, 28, 1), backbone_kwargs=SMALL)
    with pytest.raises(ValueError, match=f"^`support_labels` {message}"):
        explain.plot_emd_flows(model, _images(1)[0], _images(6, seed=1), np.array(labels),
                               str(tmp_path / "emd.png"))


def test_prototype_history_must_be_permutations(tmp_path):
    model = zoo.image_classifier("small_convnet", "hyperspherical", 5, input_shape=(28, 28, 1),
                                 backbone_kwargs=SMALL)
    for bad in ([9, 9, 9, 9, -3], [0, 0, 0, 0, 0]):
        with pytest.raises(ValueError, match=r"^`history`: assignment 1 is no permutation of 0..4"):
            explain.plot_prototypes(model, str(tmp_path / "p.png"), history=[np.arange(5), np.array(bad)])


@pytest.mark.parametrize("exclude", [[0], [5, 0, 0], [-2, 0, 0], [1.5, 0, 0]])
def test_retrieval_exclude_holds_one_gallery_index_per_query(exclude, tmp_path):
    model = zoo.embedding_model("small_convnet", "gap", 8, input_shape=(28, 28, 1), backbone_kwargs=SMALL)
    with pytest.raises(ValueError, match=r"^`exclude` must hold one gallery index in 0..4"):
        explain.plot_retrieval(model, _images(3), _images(5, seed=2), str(tmp_path / "r.png"), k=2,
                               exclude=exclude)


def test_explain_model_checks_every_kind_before_writing(mpw_model, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="^`gallery`: kind 'retrieval' needs gallery images"):
        explain.explain_model(mpw_model, str(out), images=_images(2), kinds=["mpw", "retrieval"])
    with pytest.raises(ValueError, match=r"^`names` must be distinct"):
        explain.explain_model(mpw_model, str(out), images=_images(2), names=["a", "a"], kinds=["mpw"])
    assert not out.exists()
    written = explain.explain_model(mpw_model, str(out), images=_images(2), dpi=40)  # no gallery: no retrieval
    assert sorted(written) == ["mpw"] and sorted(os.listdir(out)) == ["mpw_image0.png", "mpw_image1.png"]


@pytest.mark.parametrize("points, k", [
    (np.array([[0.0, 0.0], [0.0, 0.0], [1.0, 1.0]]), 3),
    (np.zeros((4, 2)), 3),
])
def test_greedy_k_center_indices_are_distinct(points, k):
    chosen = greedy_k_center(points, k)
    assert len(set(chosen.tolist())) == k
    assert len(set(greedy_k_center(points, k, initial=points[:1]).tolist())) == k


def test_partial_transport_that_lost_its_precision_is_not_converged():
    """At cost / epsilon near 1e10 in float32, ``log t + log s`` keeps no digit of the difference: the fixed-point
    error read 0 and the problem was reported converged with a plan of mass 0.0625 instead of 0.3."""
    cost = np.random.default_rng(0).uniform(size=(3, 8)).astype(np.float32)
    good = partial_transport(cost, 0.3)
    assert bool(good.converged) and abs(float(np.sum(good.plan)) - 0.3) < 1e-5
    for scale in (3e9, 1e10, 1e20):
        result = partial_transport(cost * scale, 0.3)
        mass = float(np.sum(result.plan))
        assert not bool(result.converged) and float(result.error) >= abs(mass - 0.3) - 1e-6, (scale, mass)


def test_explain_model_checks_labels_against_the_model_before_writing(mpw_model, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"^`labels` must be classes of the model, in 0..3, got \[12\]"):
        explain.explain_model(mpw_model, str(out), images=_images(2), labels=[0, 12], kinds=["mpw"])
    with pytest.raises(ValueError, match="^`labels` must be an integer class label"):
        explain.explain_model(mpw_model, str(out), images=_images(2), labels=[0, 1.5], kinds=["mpw"])
    assert not out.exists()


def test_the_command_line_makes_repeated_image_stems_distinct():
    from otzoo.explain_command import _distinct
    assert _distinct(["shoe", "shoe", "test00003", "shoe_1", "test00003"]) == [
        "shoe", "shoe_1", "test00003", "shoe_1_1", "test00003_1"]
    assert greedy_k_center(np.eye(3), 2, initial=np.zeros((0, 3))).shape == (2,)  # no centers in place


def test_explain_model_draws_a_kind_named_twice_once(mpw_model, tmp_path, monkeypatch):
    """``kinds=["mpw", "mpw"]`` drew (and listed) each image's MPW picture twice; repeated kinds are dropped, in the
    order of their first appearance."""
    from explain import plots
    drawn, original = [], plots.plot_mpw_plans

    def recording(model, image, path, **kwargs):
        drawn.append(os.path.basename(path))
        return original(model, image, path, **kwargs)

    monkeypatch.setattr(plots, "plot_mpw_plans", recording)
    written = explain.explain_model(mpw_model, str(tmp_path / "out"), images=_images(1), kinds=["mpw", "mpw"],
                                    dpi=40)
    assert drawn == ["mpw_image0.png"] and written == {"mpw": [str(tmp_path / "out" / "mpw_image0.png")]}
