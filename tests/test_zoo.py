"""The zoo: CIFAR-style ResNets, in-model preprocessing, the presets registry and its errors."""
import json
import os
import warnings

import keras
import numpy as np
import pytest

import zoo
from zoo import loading


@pytest.mark.parametrize("depth", [20, 32, 56])
def test_cifar_resnet_layer_count_and_feature_map(depth):
    """He et al. 2016 (Sec. 4.2): 6n+2 weighted layers (the stem, 6n 3x3 convs, the classifier) and stages of
    16/32/64 channels at 1, 1/2 and 1/4 of the input resolution."""
    backbone = zoo.cifar_resnet(depth, (32, 32, 3))
    convs = [layer for layer in backbone.layers if isinstance(layer, keras.layers.Conv2D)
             and not layer.name.endswith("shortcut_conv")]
    assert len(convs) + 1 == depth  # + the classifier a head adds
    assert backbone.output.shape[1:] == (8, 8, 64)
    assert {layer.filters for layer in convs} == {16, 32, 64}


def test_resnet20_parameter_count_matches_the_paper():
    """The paper's ResNet-20 has 0.27 M parameters; projection shortcuts add two 1x1 convs (+ BN)."""
    model = keras.Sequential([zoo.resnet20((32, 32, 3)), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(10)])
    assert 0.26e6 < model.count_params() < 0.29e6


def test_cifar_resnet_any_input_size_and_channels():
    backbone = zoo.cifar_resnet(20, (None, None, 1))
    assert backbone(np.zeros((2, 28, 28, 1), np.float32)).shape == (2, 7, 7, 64)
    assert backbone(np.zeros((1, 40, 36, 1), np.float32)).shape == (1, 10, 9, 64)


@pytest.mark.parametrize("depth", [0, 21, 2])
def test_cifar_resnet_rejects_bad_depth(depth):
    with pytest.raises(ValueError, match="depth"):
        zoo.cifar_resnet(depth)


def test_pixel_preprocessing_is_the_standardization():
    layer = zoo.pixel_preprocessing(mean=0.3, std=0.4)
    x = np.array([0.0, 76.5, 255.0], np.float32)
    np.testing.assert_allclose(np.asarray(layer(x)), (x / 255.0 - 0.3) / 0.4, rtol=1e-6)


def test_list_models_and_unknown_names():
    names = zoo.list_models()
    assert "resnet20_mpw_fashion_mnist" in names and "resnet20_gap_fashion_mnist" in names
    assert set(zoo.list_models("classification")) <= set(names)
    with pytest.raises(ValueError, match="task"):
        zoo.list_models("segmentation")
    with pytest.raises(ValueError, match="known presets: .*resnet20_mpw_fashion_mnist"):
        zoo.build("resnet99_fashion_mnist")
    # load also reads a preset directory: a name that is neither says it looked for both
    with pytest.raises(ValueError, match=r"^Unknown preset '/no/such/dir', and no preset directory of that name; "
                                         r"known presets: .*resnet20_mpw_fashion_mnist"):
        zoo.load("/no/such/dir")


def test_build_overrides_reach_the_head_and_architecture():
    model = zoo.build("resnet20_mpw_fashion_mnist", num_classes=3, epsilon=0.05)
    head = model.get_layer("mpw_head")
    assert head.num_classes == 3 and head.get_config()["epsilon"] == 0.05
    assert model.output.shape == (None, 3)


@pytest.mark.parametrize("name, overrides, layer", [
    ("resnet20_mpw_fashion_mnist", dict(head="gap_fc"), "dense_head"),
    ("resnet20_hyperspherical_fashion_mnist", dict(head="mpw", num_proxies=2), "mpw_head"),
    ("resnet20_emd_fewshot_fashion_mnist", dict(head="protonet"), "protonet_head"),
])
def test_another_head_starts_from_its_own_defaults(name, overrides, layer):
    """Another head than the preset's used to receive the preset's head arguments (the MPW preset's ``num_proxies``
    and ``epsilon`` went to ``Dense``, which Keras refused) or, for retrieval, to lose them without a word."""
    model = zoo.build(name, backbone="small_convnet", **overrides)
    config = model.get_layer(layer).get_config()
    expected = {key: value for key, value in overrides.items() if key not in ("head", "pooling")}
    assert {key: config[key] for key in expected} == expected


@pytest.mark.parametrize("name, key, message", [
    ("resnet20_mpw_fashion_mnist", "num_proxie",
     r"MultiProxyWasserstein takes no argument `num_proxie` \(did you mean `num_proxies`\?\); it takes num_proxies, "),
    ("resnet20_gsp_retrieval_fashion_mnist", "epsilonn", r"GeneralizedSumPooling takes no argument `epsilonn` "
                                                         r"\(did you mean `epsilon`\?\)"),
    ("resnet20_emd_fewshot_fashion_mnist", "scales", r"EMDHead takes no argument `scales` \(did you mean `scale`\?\)"),
    ("resnet20_gap_fashion_mnist", "units", r"the model sets Dense's `units` itself"),
    ("resnet20_gsp_retrieval_fashion_mnist", "return_attributes",
     r"the model sets GeneralizedSumPooling's `return_attributes` itself"),
    ("resnet20_gap_retrieval_fashion_mnist", "epsilon", r"the 'gap' pooling takes no arguments"),
])
def test_build_names_an_override_the_head_does_not_take(name, key, message):
    """Keras refused an unknown head argument in its own words, naming neither the override nor the arguments there
    are; the GAP retrieval preset ignored it, and the GSP one dropped ``return_attributes``."""
    with pytest.raises(ValueError, match=f"^`{key}` is not an architecture key of the .* preset '{name}' "
                                         rf"\(backbone, .*\), and {message}"):
        zoo.build(name, backbone="small_convnet", **{key: 1})
    with pytest.raises(ValueError, match="^`pretrained` is an argument of zoo.load, not of zoo.build"):
        zoo.build(name, pretrained=True)  # "did you mean `trainable`?" otherwise


def test_load_with_overrides_warns_that_the_card_describes_the_preset_without_them():
    """An override that keeps the shapes (GSP -> GAP pooling drops the GSP layer's weights; a new epsilon changes
    the logits) loaded the preset's weights without a word, under a card whose metrics no longer apply."""
    with pytest.warns(UserWarning, match=r"pooling='gap'\): the weights were trained, and the card's metrics "
                                         r"measured, without these overrides; weights of layers they remove"):
        model = zoo.load("resnet20_gsp_retrieval_fashion_mnist", pooling="gap")
    assert "gsp" not in [layer.name for layer in model.layers]


def test_load_with_overrides_that_change_nothing_loads_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the weights' and card's own architecture: nothing to warn about
        zoo.load("resnet20_gap_fashion_mnist", num_classes=10, backbone="ResNet20")
        # l2 (a training penalty, no architecture key) and the preset's own input shape as an array warned that the
        # architecture changed
        assert zoo.load("resnet20_gap_fashion_mnist", l2=5e-4).losses
        zoo.load("resnet20_gap_fashion_mnist", input_shape=np.array([28, 28, 1]))
    with pytest.raises(loading.PresetFormatError, match=r"\(not loaded: dense_head\)$"):  # no override blamed
        zoo.load("resnet20_gap_fashion_mnist", weights=zoo.preset_dir("resnet20_mpw_fashion_mnist"), num_classes=10)


def test_load_names_the_shape_and_the_override_that_keep_the_weights_out():
    """The message stopped at Keras' first line ("... Example error message for object <Dense ...>:")."""
    with pytest.raises(loading.PresetFormatError, match=r"dense_head/kernel has shape \(64, 5\) in the model and "
                                                        r"\(64, 10\) in the file \(not loaded: dense_head\) \(the "
                                                        r"overrides num_classes=5 change the preset.s architecture, "
                                                        r"which the weights may no longer fit"):
        zoo.load("resnet20_gap_fashion_mnist", num_classes=5)
    with pytest.raises(loading.PresetFormatError, match=r"Layer 'dense_head' expected 2 variables, but received 0 "
                                                        r"variables during loading.* \(not loaded: dense_head\)$"):
        zoo.load("resnet20_gap_fashion_mnist", weights=zoo.preset_dir("resnet20_mpw_fashion_mnist"))
    with pytest.raises(ValueError, match="^`weights` load pretrained weights, which `pretrained=False` declines"):
        zoo.load("resnet20_gap_fashion_mnist", pretrained=False, weights=zoo.preset_dir("resnet20_gap_fashion_mnist"))


def test_l2_takes_backbone_names_in_any_case_and_is_named_with_its_range():
    assert zoo.build("resnet20_gap_fashion_mnist", backbone="ResNet20", l2=1e-4).losses  # the kernels' penalties
    with pytest.raises(ValueError, match=r"^`l2` must be a finite number >= 0, got -1"):
        zoo.build("resnet20_gap_fashion_mnist", l2=-1)


def test_load_from_a_weights_file_and_hash_mismatch(tmp_path, monkeypatch):
    name = "resnet20_gap_fashion_mnist"
    trained = zoo.build(name)
    path = str(tmp_path / "model.weights.h5")
    trained.save_weights(path)
    with pytest.warns(UserWarning, match="not checked"):  # no card accompanies the file
        restored = zoo.load(name, weights=path)
    x = np.random.default_rng(0).uniform(0, 255, (2, 28, 28, 1)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(restored(x)), np.asarray(trained(x)), atol=0)
    with pytest.warns(UserWarning, match="not checked"):
        restored = zoo.load(name, weights=str(tmp_path))  # a directory holding model.weights.h5, without a card
    np.testing.assert_allclose(np.asarray(restored(x)), np.asarray(trained(x)), atol=0)
    # A packaged weights file whose hash differs from the card's is refused, naming both hashes.
    os.makedirs(tmp_path / "presets" / name)
    with open(tmp_path / "presets" / name / "metadata.json", "w") as handle:
        json.dump({"task": "classification", "weights_sha256": "0" * 64}, handle)
    trained.save_weights(str(tmp_path / "presets" / name / "model.weights.h5"))
    monkeypatch.setattr(loading, "PRESETS_DIR", str(tmp_path / "presets"))
    with pytest.raises(ValueError, match="expected sha256 0{64}, found [0-9a-f]{64}"):
        zoo.load(name)


def test_load_missing_files_say_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setattr(loading, "PRESETS_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="otzoo train resnet20_gap_fashion_mnist"):
        zoo.load("resnet20_gap_fashion_mnist")
    with pytest.raises(FileNotFoundError, match="no weights file"):
        zoo.load("resnet20_gap_fashion_mnist", weights=str(tmp_path / "missing.weights.h5"))


def test_save_preset_round_trip(tmp_path):
    model = zoo.build("resnet20_mpw_fashion_mnist", num_classes=4)
    directory = zoo.save_preset(model, str(tmp_path / "mine"), card={"task": "classification"})
    assert zoo.model_card(directory)["task"] == "classification"  # a directory, as zoo.load takes it
    with pytest.raises(FileNotFoundError, match="is not a preset directory: it has no metadata.json"):
        zoo.model_card(str(tmp_path))
    restored = zoo.load(directory)
    x = np.random.default_rng(1).uniform(0, 255, (2, 28, 28, 1)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(restored(x)), np.asarray(model(x)), atol=1e-6)
    with open(os.path.join(directory, "metadata.json")) as handle:
        assert json.load(handle)["weights_sha256"] == loading.sha256_of(os.path.join(directory, "model.weights.h5"))
