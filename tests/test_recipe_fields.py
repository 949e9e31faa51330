"""Every field a preset's card publishes as its recipe is read by the code that trains: changing it changes the
training set-up (``training_setup``: the model, compiled optimizer and loss, callbacks, data), inspected without
training. The TFDS paths run end to end on ``tfds.testing.mock_data``: train, load, evaluate, export."""
import dataclasses
import json
import os
import re

import keras
import numpy as np
import pytest

import zoo
from otzoo import cli
from training.data.errors import EmptySliceError
from training.recipes import classification, few_shot, retrieval
from training.recipes.common import preset_spec
from training.recipes.components import RecipeError
from zoo.registry import PRESETS
from zoo.spec import published_recipe

GAP = "resnet20_gap_fashion_mnist"
GSP = "resnet20_gsp_retrieval_fashion_mnist"
HYPER = "resnet20_hyperspherical_fashion_mnist"
EMD = "resnet20_protonet_fewshot_fashion_mnist"


def _spec(name, **recipe):
    return preset_spec(name, **recipe)


def test_every_preset_spec_is_frozen_and_its_card_publishes_its_recipe():
    for name, spec in PRESETS.items():
        with pytest.raises(dataclasses.FrozenInstanceError):
            spec.recipe.epochs = 1
        card = zoo.model_card(name)
        published = published_recipe(spec.recipe)
        kept = {k: v for k, v in card["recipe"].items() if k != "pretrained_from"}
        if "protocol" in card:  # trained by experiments/gpu_presets.py at the budget chosen on validation
            assert kept.pop("epochs") == card["protocol"]["budget"], name
            published.pop("epochs")
        elif name == HYPER:
            kept.pop("epochs")  # the packaged weights: 5 epochs; the recipe: the classification budget (10)
            published.pop("epochs")
        assert kept == published, name
    assert PRESETS[HYPER].recipe.epochs == PRESETS[GAP].recipe.epochs == 10


@pytest.mark.parametrize("field, value, accepted", [
    ("optimizer", "lamb", "['adam', 'adamw', 'sgd']"), ("schedule", "linear", "['constant', 'cosine', 'step']"),
    ("loss", "triplet", "['cross_entropy', 'hyperspherical_pull']"),
    ("callbacks", ("Nope",), "['GSPPrototypeInit', 'PrototypeReassignment']")])
def test_unknown_names_are_one_value_error_naming_the_field(field, value, accepted):
    with pytest.raises(ValueError, match=f"`{field}` must be one of {accepted.replace('[', '.').replace(']', '.')}"):
        _spec(GAP, **{field: value})


@pytest.mark.parametrize("name, recipe, field", [
    (GAP, dict(optimizer="adam", momentum=0.5), "momentum"),
    (GAP, dict(optimizer="adamw", nesterov=False), "nesterov"),
    (EMD, dict(optimizer="adam", momentum=0.0), "momentum"),
    (EMD, dict(meta_optimizer="adamw", meta_momentum=0.5), "meta_momentum"),
])
def test_a_field_the_optimizer_does_not_use_is_refused(name, recipe, field):
    """Adam and AdamW take neither momentum nor Nesterov: a recipe changing them would train as if it had not."""
    with pytest.raises(ValueError, match=f"recipe field `{field}` .* applies to `(meta_)?optimizer` \\['sgd'\\] "
                                         "only; 'adamw?' does not use it"):
        _spec(name, **recipe)


def test_an_optimizer_with_the_default_momentum_or_sgd_with_any_is_accepted():
    assert _spec(GAP, optimizer="adam").recipe.momentum == 0.9  # the default: nothing was asked of Adam
    assert _spec(GAP, optimizer="adamw", momentum=0.9, nesterov=True).recipe.optimizer == "adamw"
    assert _spec(GAP, momentum=0.5, nesterov=False).recipe.momentum == 0.5
    assert _spec(EMD, meta_optimizer="adam", momentum=0.5).recipe.meta_optimizer == "adam"  # momentum: pre-training


def test_the_command_line_refuses_an_unused_optimizer_field_in_one_line(capsys):
    assert cli.main(["train", GAP, "--recipe", "optimizer=adam", "--recipe", "momentum=0.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--recipe: recipe field `momentum` (0.5) applies to `optimizer` ['sgd'] only" in err, err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("name", [GAP, EMD])
def test_a_pad_the_augmentation_does_not_use_is_refused(name):
    """``augment="none"`` pads nothing: a ``pad`` changed with it was taken, ignored and published in the card."""
    with pytest.raises(ValueError, match=r"^recipe field `pad` \(8\) applies to `augment` \['pad_crop_flip'\] only; "
                                         "'none' pads nothing: leave it at its default 2"):
        _spec(name, augment="none", pad=8)
    assert _spec(name, augment="none").recipe.pad == 2  # the default: nothing asked of it
    assert _spec(name, pad=0).recipe.pad == 0  # pad_crop_flip reads it (0: flips only)
    with pytest.raises(ValueError, match="`augment` must be one of"):  # an unknown name first, not the pad
        _spec(name, augment="jitter", pad=8)


def test_the_command_line_refuses_an_unused_pad_in_one_line(capsys):
    assert cli.main(["train", GAP, "--recipe", 'augment="none"', "--recipe", "pad=8"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--recipe: recipe field `pad` (8) applies to `augment`" in err, err


def test_numpy_scalar_overrides_become_python_values_before_anything_is_read():
    """``np.int64`` and ``np.float32`` overrides passed the checks, then ``run.json`` (JSON) failed with "not JSON
    serializable" after the data were read and the model built."""
    from training.recipes.run_directory import run_identity

    spec = _spec(GAP, seed=np.int64(1), learning_rate=np.float32(0.5), nesterov=np.bool_(False),
                 loss_kwargs={})
    assert type(spec.recipe.seed) is int and spec.recipe.seed == 1
    assert type(spec.recipe.learning_rate) is float and spec.recipe.learning_rate == 0.5
    assert spec.recipe.nesterov is False
    assert run_identity(spec, limit=np.int64(256))["options"]["limit"] == 256
    few = _spec(EMD, eval_shots=[np.int64(1), np.int64(3)], meta_episodes=np.int32(7))
    assert list(few.recipe.eval_shots) == [1, 3] and all(type(n) is int for n in few.recipe.eval_shots)
    json.dumps(published_recipe(few.recipe))
    json.dumps(published_recipe(_spec(GSP, loss_kwargs={"temperature": np.float64(0.2)}).recipe))
    with pytest.raises(ValueError, match=r"^recipe field `seed` must be an integer"):
        _spec(GAP, seed=np.float64(1.5))


@pytest.mark.parametrize("options, match", [
    (dict(epochs=50), r"recipe field `pretrain_epochs` \(`epochs`\) \(50\) sets pre-training, which `pretrained` "
                      r"skips \(its backbone was pre-trained with 4\): leave it out"),
    (dict(batch_size=32), r"recipe field `batch_size` \(32\)"),
    (dict(recipe_overrides={"learning_rate": 0.7, "l2": 0.01}), r"recipe field `learning_rate` \(0.7\)"),
    (dict(recipe_overrides={"l2": 0.01}), r"recipe field `l2` \(0.01\)"),
    (dict(recipe_overrides={"augment": "none"}), r"recipe field `augment` \('none'\)"),
    (dict(recipe_overrides={"schedule": "step", "nesterov": False}), r"recipe field `nesterov` \(False\)"),
])
def test_pre_training_fields_are_refused_with_a_pretrained_backbone(tmp_path, options, match):
    """A run given ``pretrained`` skips pre-training: its pre-training fields were ignored, yet published in the
    card. Refused before anything is read."""
    with pytest.raises(RecipeError, match=f"^{match}"):
        few_shot.train(EMD, str(tmp_path / "run"), pretrained=str(tmp_path / "elsewhere"), **options)
    assert not (tmp_path / "run").exists()


def test_a_pretrained_run_takes_the_pre_training_fields_of_the_run_that_pre_trained_its_backbone(tmp_path):
    """The card of a run given ``pretrained`` states the pre-training its backbone had: that run's recorded recipe
    (run.json), or the preset's where there is no record. A field given as that value passes; another is refused,
    and so is the preset's value where the backbone was pre-trained otherwise."""
    from training.recipes.run_directory import RUN_FILE, run_identity

    preset = PRESETS[EMD].recipe
    assert few_shot.pretraining_fields(str(tmp_path), preset) == {f: getattr(preset, f)
                                                                  for f in few_shot.PRETRAINING_FIELDS}
    other = _spec(EMD, pretrain_epochs=50, batch_size=32, pad=3)
    (tmp_path / RUN_FILE).write_text(json.dumps(run_identity(other)))
    reference = few_shot.pretraining_fields(str(tmp_path / few_shot.PRETRAINED_FILE), preset)
    assert (reference["pretrain_epochs"], reference["batch_size"], reference["pad"]) == (50, 32, 3)
    given = _spec(EMD, pretrain_epochs=50, seed=3, meta_episodes=9, eval_episodes=5)
    few_shot.check_pretraining_fields(given.recipe, {"pretrain_epochs", "seed", "meta_episodes", "eval_episodes"},
                                      reference)
    assert given.with_recipe(**reference).recipe.batch_size == 32
    with pytest.raises(RecipeError, match=r"`pretrain_epochs` \(`epochs`\) \(4\) .*pre-trained with 50"):
        few_shot.check_pretraining_fields(_spec(EMD, pretrain_epochs=4).recipe, {"pretrain_epochs"}, reference)


def test_the_command_line_refuses_pre_training_epochs_with_pretrained_in_one_line(tmp_path, capsys, monkeypatch):
    def no_set_up(*args, **kwargs):
        raise AssertionError("the run was set up (its data read, its model built)")

    monkeypatch.setattr(few_shot, "training_setup", no_set_up)
    (tmp_path / few_shot.PRETRAINED_FILE).write_bytes(b"weights")
    assert cli.main(["train", EMD, "--pretrained", str(tmp_path), "--epochs", "50", "--out",
                     str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "recipe field `pretrain_epochs` (`epochs`) (50) sets pre-training" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.fashion_mnist
def test_few_shot_fine_tuning_describes_all_the_images_without_a_limit():
    """``limit=None`` (every base-class image) failed formatting ``None`` with ``,``."""
    _, _, episodes, _, fitted = few_shot.fine_tune_setup(EMD, None, None, 0, 128, 15)
    assert fitted.endswith("drawn from the 30,000 base-class training images"), fitted
    assert episodes.episodes == 30_000 // (5 * 16)
    fitted = few_shot.fine_tune_setup(EMD, None, 600, 0, 128, 15).fitted
    assert fitted.endswith("base-class training images among the first 600"), fitted


@pytest.mark.fashion_mnist
@pytest.mark.parametrize("recipe, name, limit, overrides, message", [
    (classification, GAP, 5, {}, "the train split of fashion_mnist holds 5 images, fewer than one training batch of "
                                 "128 among the first 5"),
    (retrieval, GSP, 100, {}, "the train part of the retrieval protocol of fashion_mnist holds 56 images, fewer than "
                              "one training batch of 128"),
    (few_shot, EMD, 100, {}, "base-class training images, fewer than one batch of 128"),
    # one batch of 8, but too few images per class for meta-training's 5-way 1-shot episodes with 15 queries
    (few_shot, EMD, 40, {"batch_size": 8}, "base class(es) with 16 images or more; 5-way 1-shot meta-training"),
])
def test_a_slice_too_small_for_the_setup_names_limit(recipe, name, limit, overrides, message):
    """Every ``training_setup`` refuses a slice too small to train on with an EmptySliceError naming ``limit``
    (``otzoo`` prints it as ``--limit N: ...``, exit status 2), before building or training anything."""
    with pytest.raises(EmptySliceError) as info:
        recipe.training_setup(_spec(name, **overrides), limit=limit)
    assert info.value.parameter == "limit" and info.value.value == limit
    assert message in str(info.value)


@pytest.mark.fashion_mnist
def test_classification_fields_change_the_setup():
    base = classification.training_setup(_spec(GAP), limit=256)
    assert isinstance(base.optimizer, keras.optimizers.SGD) and base.optimizer.nesterov
    assert float(base.optimizer.momentum) == 0.9
    schedule = base.optimizer._learning_rate
    assert isinstance(schedule, keras.optimizers.schedules.CosineDecay) and schedule.decay_steps == base.steps
    assert base.steps == 256 // 128 * 10
    assert isinstance(base.loss, keras.losses.SparseCategoricalCrossentropy) and base.callbacks == []

    adam = classification.training_setup(_spec(GAP, optimizer="adam", schedule="constant", epochs=3), limit=256)
    assert isinstance(adam.optimizer, keras.optimizers.Adam)
    assert float(keras.ops.convert_to_numpy(adam.optimizer.learning_rate)) == pytest.approx(0.1)
    assert adam.steps == 2 * 3
    adamw = classification.training_setup(_spec(GAP, optimizer="adamw", schedule="step"), limit=256)
    assert isinstance(adamw.optimizer, keras.optimizers.AdamW)
    assert isinstance(adamw.optimizer._learning_rate, keras.optimizers.schedules.PiecewiseConstantDecay)
    sgd = classification.training_setup(_spec(GAP, momentum=0.5, nesterov=False, learning_rate=0.3), limit=256)
    assert float(sgd.optimizer.momentum) == 0.5 and not sgd.optimizer.nesterov
    assert sgd.optimizer._learning_rate.initial_learning_rate == 0.3

    # augment: pad-crop-flip moves pixels; "none" yields the images as they are (in the same shuffled order)
    plain = classification.training_setup(_spec(GAP, augment="none", batch_size=256), limit=256)
    x, _ = next(iter(plain.train.dataset))
    from training.data.fashion_mnist import load_fashion_mnist
    images, _ = load_fashion_mnist("train", limit=256, normalize=False)
    originals = {im.tobytes() for im in images.astype(np.float32)}
    assert all(im.tobytes() in originals for im in x.numpy())
    augmented = classification.training_setup(_spec(GAP, batch_size=256, pad=4), limit=256)
    x, _ = next(iter(augmented.train.dataset))
    assert sum(im.tobytes() not in originals for im in x.numpy()) > 100

    l2 = classification.training_setup(_spec(GAP, l2=0.0, jit_compile=False, seed=5), limit=256)
    assert not l2.model.losses and l2.trained.jit_compile is False
    assert base.model.losses  # the recipe's L2 on the backbone's kernels


@pytest.mark.fashion_mnist
def test_loss_and_callbacks_fields_change_the_setup():
    hyper = classification.training_setup(_spec(HYPER), limit=256)
    assert type(hyper.loss).__name__ == "HypersphericalPullLoss" and len(hyper.trained.inputs) == 2
    assert [type(c).__name__ for c in hyper.callbacks] == ["PrototypeReassignment"]
    assert classification.training_setup(_spec(HYPER, callbacks=()), limit=256).callbacks == []

    gsp = retrieval.training_setup(_spec(GSP), limit=512)
    assert type(gsp.loss).__name__ == "ProxyNCAPlusPlusLoss" and gsp.loss.temperature == 0.1
    assert [type(c).__name__ for c in gsp.callbacks] == ["GSPPrototypeInit"]
    anchor = retrieval.training_setup(_spec(GSP, loss="proxy_anchor", loss_kwargs={"margin": 0.2, "num_proxies": 2},
                                           callbacks=()), limit=512)
    assert type(anchor.loss).__name__ == "ProxyAnchorLoss" and anchor.loss.margin == 0.2
    assert anchor.trained.get_layer("proxies").num_proxies == 2 and anchor.callbacks == []
    with pytest.raises(ValueError, match="`loss_kwargs` of loss 'proxy_nca_plus_plus' accepts"):
        _spec(GSP, loss_kwargs={"margin": 0.2})
    with pytest.raises(ValueError, match="`callbacks`: GSPPrototypeInit drives the layer 'gsp'"):
        classification.training_setup(_spec(GAP, callbacks=("GSPPrototypeInit",)), limit=256)


@pytest.mark.fashion_mnist
def test_few_shot_fields_change_the_setup():
    setup = few_shot.training_setup(_spec(EMD), limit=512)
    assert isinstance(setup.meta_optimizer, keras.optimizers.SGD)
    assert float(setup.meta_optimizer.momentum) == 0.9
    assert isinstance(setup.pretrain_optimizer._learning_rate, keras.optimizers.schedules.CosineDecay)
    assert setup.pretrain_optimizer._learning_rate.decay_steps == len(setup.images) // 128 * 4
    other = few_shot.training_setup(_spec(EMD, meta_optimizer="adam", meta_learning_rate=0.01, optimizer="adamw",
                                          pretrain_epochs=2), limit=512)
    assert isinstance(other.meta_optimizer, keras.optimizers.Adam)
    assert float(keras.ops.convert_to_numpy(other.meta_optimizer.learning_rate)) == pytest.approx(0.01)
    assert isinstance(other.pretrain_optimizer, keras.optimizers.AdamW)
    assert other.pretrain_optimizer._learning_rate.decay_steps == len(other.images) // 128 * 2
    with pytest.raises(ValueError, match="`meta_optimizer` must be one of"):
        _spec(EMD, meta_optimizer="rmsprop")


# ---- the TFDS data sets by name, on mock data ----

def mock_data(num_examples):
    """``tfds.testing.mock_data`` (offline TFDS data sets); the test is skipped without tensorflow_datasets."""
    return pytest.importorskip("tensorflow_datasets").testing.mock_data(num_examples=num_examples)


def test_dataset_field_changes_the_loader_and_the_architecture():
    with mock_data(64):
        setup = classification.training_setup(preset_spec(GAP, dataset="cifar10", batch_size=32), limit=64)
    assert setup.model.input_shape == (None, 32, 32, 3) and setup.model.output_shape == (None, 10)
    assert setup.train.dataset.element_spec[0].shape.as_list() == [32, 32, 32, 3] and setup.train.examples == 64
    assert preset_spec(GSP, dataset="cars196", image_size=32).data.train_classes == tuple(range(98))
    with pytest.raises(ValueError, match="`augment` must be one of"):
        preset_spec(GAP, dataset="cifar10", augment="jitter")
    with pytest.raises(ValueError, match="`augment` must be one of"):
        preset_spec(GAP, augment="resize_crop_flip")  # Fashion-MNIST in memory: pad_crop_flip or none
    assert preset_spec(GAP, dataset="cifar10", augment="resize_crop_flip").recipe.augment == "resize_crop_flip"
    # a few-shot run reads its TFDS images into memory: resize_crop_flip was taken, then failed after the read
    with pytest.raises(ValueError, match=r"`augment` must be one of \['pad_crop_flip', 'none'\] for a few-shot run"):
        preset_spec(EMD, dataset="cifar100", augment="resize_crop_flip")


def _end_to_end(tmp_path, capsys, preset, dataset, *options, shape):
    out = str(tmp_path / "run")
    with mock_data(300):
        status = cli.main(["train", preset, "--dataset", dataset, "--epochs", "1", "--out", out, "--image-size",
                           "32", *options])
        assert status == 0, capsys.readouterr().err
        for name in ("config.json", "model.weights.h5", "metadata.json"):
            assert os.path.isfile(os.path.join(out, name))
        with open(os.path.join(out, "metadata.json")) as handle:
            card = json.load(handle)
        assert card["dataset"] == dataset and card["task"] == PRESETS[preset].task
        model = zoo.load(out)
        rng = np.random.default_rng(0)
        if PRESETS[preset].task == "few_shot":  # a 5-way 1-shot episode with 2 queries per class
            inputs = {"query_images": rng.uniform(0, 255, (10,) + shape).astype("float32"),
                      "support_images": rng.uniform(0, 255, (5,) + shape).astype("float32"),
                      "support_labels": np.arange(5, dtype="int32")}
            outputs = model.predict_on_batch(inputs)
        else:
            outputs = model.predict(rng.uniform(0, 255, (4,) + shape).astype("float32"), verbose=0)
        assert np.all(np.isfinite(outputs))
        status = cli.main(["evaluate", out] + (["--episodes", "2"] if PRESETS[preset].task == "few_shot" else []))
        assert status == 0, capsys.readouterr().err
        capsys.readouterr()
        # verified on the data set's own (mock) test images, in a process without otzoo
        status = cli.main(["export", out, "--out", str(tmp_path / "export"), "--format", "saved_model",
                           "--images", "8"])
        printed = capsys.readouterr()
        assert status == 0, printed.err
        assert re.search(rf"on \d+ {dataset} test images", printed.out) and "parity holds" in printed.out, printed.out
    return card


@pytest.mark.slow  # end to end on mock TFDS data: 45-60 s each on two cores
def test_classification_on_cifar10_end_to_end(tmp_path, capsys):
    card = _end_to_end(tmp_path, capsys, GAP, "cifar10", "--limit", "256", shape=(32, 32, 3))
    assert card["input_shape"] == [32, 32, 3]
    assert card["split"].endswith("; trained on the first 256 images of the training split (--limit 256)")


@pytest.mark.slow
def test_retrieval_on_cars196_end_to_end(tmp_path, capsys):
    card = _end_to_end(tmp_path, capsys, "resnet20_gap_retrieval_fashion_mnist", "cars196", "--limit", "512",
                       "--batch-size", "32", shape=(32, 32, 3))
    assert card["train_classes"] == list(range(98)) and card["eval_classes"] == list(range(98, 196))
    assert card["split"].endswith("; trained on the first 512 images of the training split (those of the training "
                                  "classes among them) (--limit 512)")


@pytest.mark.long
@pytest.mark.slow  # CI keeps one classification (CIFAR-10), one retrieval (Cars196) and one few-shot data set
@pytest.mark.parametrize("preset, dataset, seen", [
    ("resnet20_gsp_retrieval_fashion_mnist", "caltech_birds2011", 100),  # GSP with its prototype initialization
    ("resnet20_gap_retrieval_fashion_mnist", "stanford_online_products", 11318),
])
def test_retrieval_on_the_other_tfds_sets_end_to_end(tmp_path, capsys, preset, dataset, seen):
    card = _end_to_end(tmp_path, capsys, preset, dataset, "--limit", "512", "--batch-size", "32",
                       shape=(32, 32, 3))
    assert card["train_classes"] == list(range(seen)) and card["recipe"]["augment"] == PRESETS[preset].recipe.augment


@pytest.mark.slow
def test_few_shot_on_cifar100_end_to_end(tmp_path, capsys):
    card = _end_to_end(tmp_path, capsys, EMD, "cifar100", "--limit", "512", "--batch-size", "32", "--episodes", "2",
                       "--recipe", "queries=2", "--recipe", "eval_shots=[1]", "--recipe", "eval_queries=2",
                       "--recipe", "eval_episodes=2", shape=(32, 32, 3))
    assert card["recipe"]["meta_episodes"] == 2 and card["recipe"]["queries"] == 2
    assert card["split"].endswith("; trained on the first 512 images of the training split (those of the training "
                                  "classes among them) (--limit 512)")


def test_an_empty_slice_is_one_line_exit_2(tmp_path, capsys):
    with mock_data(64):
        status = cli.main(["train", "resnet20_gap_retrieval_fashion_mnist", "--dataset", "cifar100", "--limit", "8",
                           "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and "--limit 8" in err, err


def test_the_spec_of_a_fine_tuned_card_is_its_base_presets():
    """A fine-tuned card is named ``<preset>_fine_tuned``: card_spec took the first preset of its task (the GAP
    classifier's architecture for a fine-tuned MPW or hyperspherical run)."""
    import zoo
    from training.recipes.common import card_spec

    for name in ("resnet20_mpw_fashion_mnist", "resnet20_gsp_retrieval_fashion_mnist"):
        card = dict(zoo.model_card(name), name=f"{name}_fine_tuned", fine_tuned={"base": name})
        assert card_spec(card).architecture == zoo.registry.PRESETS[name].architecture
    card = dict(zoo.model_card("resnet20_mpw_fashion_mnist"), name=["not", "a", "name"])
    assert card_spec(card).task == "classification"  # a name of the wrong type: the first preset of the task
