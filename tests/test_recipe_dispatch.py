"""A preset's task reaches its code through one table, ``training.recipes.RECIPES`` (task -> recipe module), and
``zoo.loading.TASK_BUILDERS`` for the untrained model: every recipe module offers what ``otzoo train``,
``evaluate``, ``fine-tune`` and ``tune`` call on it, and the command line reads the per-task options from it."""
import numpy as np
import pytest

import zoo
from otzoo import cli
from training.data.errors import EmptySliceError
from training.data.fashion_mnist import fashion_mnist_split, load_fashion_mnist
from training.recipes import RECIPES, classification, common, evaluate_preset, few_shot, recipe_for, retrieval
from training.recipes.common import preset_spec
from training.tuning.search import tunable_tasks, tuning_objective
from zoo.loading import TASK_BUILDERS
from zoo.registry import PRESETS
from zoo.spec import TASKS

GAP = "resnet20_gap_fashion_mnist"
GSP = "resnet20_gsp_retrieval_fashion_mnist"
EMD = "resnet20_emd_fewshot_fashion_mnist"


def test_every_task_has_one_recipe_module_and_one_builder():
    assert tuple(RECIPES) == TASKS == tuple(TASK_BUILDERS)
    assert {recipe_for(spec.task) for spec in PRESETS.values()} == {classification, retrieval, few_shot}
    with pytest.raises(ValueError, match="`task` must be one of"):
        recipe_for("segmentation")


@pytest.mark.parametrize("task", list(RECIPES))
def test_every_recipe_module_offers_what_the_commands_call(task):
    recipe = RECIPES[task]
    for function in ("training_setup", "train", "evaluate", "check_evaluation_limit", "fine_tune_setup"):
        assert callable(getattr(recipe, function)), function
    assert isinstance(recipe.TRAIN_OPTIONS, tuple) and isinstance(recipe.EVALUATE_OPTIONS, tuple)
    if recipe.TUNING_OBJECTIVE is not None:
        for function in ("tuning_data", "tuning_parts", "tuning_score"):
            assert callable(getattr(recipe, function)), function


def test_the_tunable_tasks_are_those_with_an_objective():
    assert tunable_tasks() == ["classification", "retrieval"]
    assert tuning_objective("classification") == "val_accuracy"
    assert tuning_objective("retrieval") == "val_map_at_r"
    assert tuning_objective("few_shot") is None


def test_the_tuning_scores():
    labels = np.array([0, 0, 1, 1])
    assert classification.tuning_score(np.array([[2.0, 0], [1, 0], [0, 1], [1, 0]]), labels) == 0.75
    # a column of labels gave 0.5 here (compared with the predictions as an (N, N) table)
    assert classification.tuning_score(np.array([[2.0, 0], [1, 0], [0, 1], [1, 0]]), labels[:, None]) == 0.75
    with pytest.raises(ValueError, match="^`outputs` must be logits"):
        classification.tuning_score(np.zeros((3, 2)), labels)
    separated = np.array([[1.0, 0.0], [0.99, 0.1], [0.0, 1.0], [0.1, 0.99]])
    assert retrieval.tuning_score(separated, labels) == pytest.approx(1.0)


def test_the_tuning_parts_of_each_tunable_task():
    spec = preset_spec(GAP)
    served = zoo.build(GAP, backbone="small_convnet")
    images = np.zeros((4, 28, 28, 1), np.uint8)
    model, loss, callbacks, feed = classification.tuning_parts(spec, served, (images, np.arange(4)), spec.recipe)
    assert model is served and callbacks == [] and feed(1, 2) == (1, 2)
    gsp = preset_spec(GSP)
    served = zoo.build(GSP, backbone="small_convnet")
    model, loss, callbacks, feed = retrieval.tuning_parts(gsp, served, (images, np.array([0, 1, 2, 2])), gsp.recipe)
    assert model.get_layer("proxies").num_classes == 3 and feed is None
    assert [type(c).__name__ for c in callbacks] == ["GSPPrototypeInit"]


def _fails_with(args, message, capsys):
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    return err


def test_the_command_line_refuses_the_options_a_task_does_not_take(capsys, tmp_path):
    _fails_with(["train", GAP, "--episodes", "3", "--pretrained", str(tmp_path)],
                f"--episodes, --pretrained apply to few-shot presets only; {GAP} is a classification preset.", capsys)
    _fails_with(["train", EMD, "--config", str(tmp_path / "best.json")],
                f"--config applies to classification and retrieval presets only; {EMD} is a few-shot preset.", capsys)
    _fails_with(["evaluate", GSP, "--episodes", "3"],
                f"--episodes applies to few-shot presets only; {GSP} is a retrieval preset.", capsys)


def test_the_command_line_reads_the_options_from_the_recipe_module(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(few_shot, "TRAIN_OPTIONS", ("episodes",))
    _fails_with(["train", EMD, "--pretrained", str(tmp_path)],
                f"--pretrained applies to no preset's task; {EMD} is a few-shot preset.", capsys)


@pytest.mark.fashion_mnist
@pytest.mark.parametrize("name, limit", [(GSP, 3), (EMD, 100)])
def test_check_evaluation_limit_names_limit(name, limit):
    spec = PRESETS[name]
    recipe_for(spec.task).check_evaluation_limit(spec, None)  # no limit: nothing to check
    recipe_for(spec.task).check_evaluation_limit(spec, 10000)
    with pytest.raises(EmptySliceError) as info:
        recipe_for(spec.task).check_evaluation_limit(spec, limit)
    assert info.value.parameter == "limit" and info.value.value == limit
    assert str(info.value).startswith(f"`limit` {limit}: the first {limit} test images hold")
    classification.check_evaluation_limit(PRESETS[GAP], 1)  # accuracy: any non-empty slice


@pytest.mark.fashion_mnist
def test_evaluate_preset_names_a_limit_too_small_before_loading(monkeypatch, tmp_path):
    """The Python call, not only ``otzoo evaluate``: it told of `labels` (few_shot_accuracy's) after loading."""
    monkeypatch.setattr(common, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(EmptySliceError, match=r"^`limit` 20: the first 20 test images hold"):
        evaluate_preset(EMD, limit=20, episodes=2)
    zoo.save_preset(zoo.build(GSP, backbone="small_convnet"), str(tmp_path / "copy"),  # a preset directory
                    {"name": GSP, "task": "retrieval", "dataset": "fashion_mnist", "input_shape": [28, 28, 1]})
    with pytest.raises(EmptySliceError, match=r"^`limit` 3: the first 3 test images hold"):
        evaluate_preset(str(tmp_path / "copy"), limit=3)


@pytest.mark.fashion_mnist
def test_fine_tune_setup_of_each_task():
    """Each task's fine-tuning set-up, with what an epoch fits in words: the images of full batches (the incomplete
    last batch dropped, and said so), which ``otzoo fine-tune`` prints and the card records."""
    gap = zoo.build(GAP, backbone="small_convnet")
    trained, loss, data, evaluation, fitted = classification.fine_tune_setup(GAP, gap, 300, 0, 128, 15)
    x, y = next(iter(data))
    assert trained is gap and x.shape == (128, 28, 28, 1) and type(loss).__name__ == "SparseCategoricalCrossentropy"
    assert sum(int(np.shape(y)[0]) for _, y in data) == 256
    assert fitted == "256 of the first 300 training images (the last 44, an incomplete batch of 128, dropped)"
    assert classification.fine_tune_setup(GAP, gap, 256, 0, 128, 15).fitted == "the first 256 training images"
    _same_slice_unaugmented(evaluation, 300, *load_fashion_mnist("train", limit=300, normalize=False))
    gsp = zoo.build(GSP, backbone="small_convnet")
    trained, loss, data, evaluation, fitted = retrieval.fine_tune_setup(GSP, gsp, 512, 0, 128, 15)
    x, y = next(iter(data))
    assert int(np.max(y)) < 5  # the seen classes 0-4, relabelled
    assert trained.get_layer("proxies").num_classes == len(PRESETS[GSP].data.train_classes) == 5  # one per seen class
    seen = sum(int(np.shape(y)[0]) for _, y in data)
    assert seen % 128 == 0 and fitted.startswith(f"{seen:,} of the ") and "seen classes among the first 512" in fitted
    images, labels = fashion_mnist_split("retrieval", "train", limit=512, normalize=False, relabel=True)
    _same_slice_unaugmented(evaluation, len(images), images, labels)
    emd = zoo.build(EMD, backbone="small_convnet")
    trained, loss, data, evaluation, fitted = few_shot.fine_tune_setup(EMD, emd, 512, 0, 128, 15)
    (query, support, support_labels), query_labels = next(iter(data))
    assert trained is emd and query.shape[0] == 75 and support.shape[0] == 5
    assert fitted.startswith(f"{len(data)} 5-way 1-shot episodes of 15 queries per class drawn from the ")
    assert fitted.endswith("base-class training images among the first 512")
    assert evaluation is data  # an episode depends on its index alone


def _same_slice_unaugmented(evaluation, count, images, labels):
    """The loss before and after fine-tuning is measured on the slice's images as they are, in order, every one of
    them (the training batches are augmented anew each epoch, and drop an incomplete batch)."""
    batches = list(evaluation)
    got_images = np.concatenate([np.asarray(x) for x, _ in batches])
    got_labels = np.concatenate([np.asarray(y) for _, y in batches])
    assert len(got_images) == count
    np.testing.assert_array_equal(got_images, np.asarray(images, np.float32))
    np.testing.assert_array_equal(got_labels, labels)


def test_fine_tune_images_states_the_dropped_remainder():
    assert common.fine_tune_images(4096, 128, "training images") == "the first 4,096 training images"
    assert common.fine_tune_images(4100, 128, "training images") == (
        "4,096 of the first 4,100 training images (the last 4, an incomplete batch of 128, dropped)")
    assert common.fine_tune_images(2050, 128, "training images of the seen classes", among=4096) == (
        "2,048 of the 2,050 training images of the seen classes among the first 4,096 (the last 2, an incomplete "
        "batch of 128, dropped)")
