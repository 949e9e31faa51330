"""One preset format (config.json, model.weights.h5, metadata.json) for built-in and saved presets, weights checked
against their card before they load, models that state their task, and the one layer walk."""
import json
import os
import shutil
import sys

import keras
import numpy as np
import pytest

import export
import ot_layers
import zoo
from ot_layers.layers.base import ExportableLayer
from ot_layers.task_model import TaskModel, model_task, with_task
from ot_layers.tensor_ops import find_layer, walk_layers
from otzoo import cli, export_command
from zoo import loading, preset_format
from zoo.preset_format import CONFIG_FILE, WEIGHTS_FILE, WeightsIntegrityError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
from write_preset_configs import preset_config  # noqa: E402

NAME = "resnet20_mpw_fashion_mnist"
X = np.random.default_rng(0).uniform(0, 255, (2, 28, 28, 1)).astype(np.float32)
TINY = dict(input_shape=(16, 16, 1), backbone_kwargs={"width": 4, "feature_dim": 8})


@pytest.fixture
def copied(tmp_path):
    """A copy of a built-in preset directory."""
    return shutil.copytree(loading.preset_dir(NAME), str(tmp_path / "copy"))


def _flip_one_byte(path):
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize("name", zoo.list_models())
def test_shipped_config_json_is_what_build_gives(name):
    path = os.path.join(loading.preset_dir(name), CONFIG_FILE)
    with open(path) as handle:
        shipped = json.load(handle)
    assert shipped == json.loads(zoo.build(name).to_json()), f"stale {path}: run scripts/write_preset_configs.py"
    assert shipped["class_name"] == "TaskModel" and shipped["config"]["task"] == zoo.model_card(name)["task"]
    with open(path) as handle:
        assert handle.read() == preset_config(name)


def test_a_copied_builtin_preset_loads_like_the_builtin_one(copied):
    builtin, copy = zoo.load(NAME), zoo.load(copied)
    assert model_task(builtin) == model_task(copy) == "classification"
    np.testing.assert_array_equal(np.asarray(copy(X)), np.asarray(builtin(X)))
    # one path: the built-in name is its package directory, read by the same reader
    assert type(builtin) is type(copy) and isinstance(copy, TaskModel)  # the classification TaskModel
    np.testing.assert_array_equal(np.asarray(preset_format.load_preset(loading.preset_dir(NAME))(X)),
                                  np.asarray(builtin(X)))


def test_one_flipped_byte_is_refused_by_every_path(copied, tmp_path, capsys):
    weights = os.path.join(copied, WEIGHTS_FILE)
    _flip_one_byte(weights)
    expected = zoo.model_card(NAME)["weights_sha256"]
    message = f"{weights} does not match its card: expected sha256 {expected}, found [0-9a-f]{{64}}"
    for call in (lambda: zoo.load(copied), lambda: zoo.load(NAME, weights=copied),
                 lambda: zoo.load(NAME, weights=weights)):
        with pytest.raises(WeightsIntegrityError, match=message):
            call()
    assert issubclass(WeightsIntegrityError, ValueError)
    out = str(tmp_path / "exported")
    for argv in (["export", copied, "--out", out], ["evaluate", copied]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "sha256" in err and expected in err and len(err.splitlines()) == 1, err
    assert not os.path.exists(out)


def test_packaged_weights_are_checked_before_loading(tmp_path, monkeypatch):
    presets = tmp_path / "presets"
    shutil.copytree(loading.preset_dir(NAME), str(presets / NAME))
    _flip_one_byte(str(presets / NAME / WEIGHTS_FILE))
    monkeypatch.setattr(loading, "PRESETS_DIR", str(presets))
    for kwargs in ({}, {"num_classes": 10}):  # the directory path and the rebuild-then-load path
        with pytest.raises(WeightsIntegrityError, match="sha256"):
            zoo.load(NAME, **kwargs)


def test_a_url_download_is_checked_and_a_bad_one_dropped(tmp_path, monkeypatch):
    bad = str(tmp_path / "download.weights.h5")
    shutil.copy(os.path.join(loading.preset_dir("resnet20_gap_fashion_mnist"), WEIGHTS_FILE), bad)
    monkeypatch.setattr(keras.utils, "get_file", lambda *args, **kwargs: bad)
    with pytest.raises(WeightsIntegrityError, match=f"expected sha256 {zoo.model_card(NAME)['weights_sha256']}"):
        zoo.load(NAME, weights="https://example.invalid/model.weights.h5")
    assert not os.path.exists(bad)


def test_a_bare_weights_file_loads_with_a_warning(tmp_path):
    model = zoo.build("resnet20_gap_fashion_mnist")
    path = str(tmp_path / "mine.weights.h5")
    model.save_weights(path)
    with pytest.warns(UserWarning, match="not checked"):
        restored = zoo.load("resnet20_gap_fashion_mnist", weights=path)
    np.testing.assert_array_equal(np.asarray(restored(X)), np.asarray(model(X)))


def test_save_preset_writes_the_format_and_requires_a_task(tmp_path):
    model = zoo.image_classifier("small_convnet", "gap_fc", 3, **TINY)
    directory = zoo.save_preset(model, str(tmp_path / "mine"), card={"name": "mine"})
    assert sorted(os.listdir(directory)) == ["config.json", "metadata.json", "model.weights.h5"]
    card = preset_format.read_card(directory)
    assert card["task"] == "classification" and card["weights_sha256"] == preset_format.sha256_of(
        os.path.join(directory, WEIGHTS_FILE))
    pixels = np.random.default_rng(1).uniform(0, 255, (2, 16, 16, 1)).astype(np.float32)
    restored = zoo.load(directory)
    assert model_task(restored) == "classification"
    np.testing.assert_allclose(np.asarray(restored(pixels)), np.asarray(model(pixels)), atol=1e-6)
    plain = keras.Model(model.inputs, model.outputs)  # states no task
    with pytest.raises(ValueError, match="task"):
        zoo.save_preset(plain, str(tmp_path / "untasked"), card={"name": "untasked"})
    directory = zoo.save_preset(plain, str(tmp_path / "tasked"), card={"task": "retrieval"})
    assert model_task(zoo.load(directory)) == "retrieval"
    with pytest.raises(ValueError, match="states task 'classification'"):
        zoo.save_preset(model, str(tmp_path / "clash"), card={"task": "retrieval"})


def test_a_preset_leaves_out_how_its_model_was_compiled(tmp_path):
    """A preset written after ``compile`` holds no optimizer: on PyTorch Keras' optimizer is a class of its torch
    backend, which another backend cannot import. A preset that holds one (written before) loads without it."""
    model = zoo.image_classifier("small_convnet", "gap_fc", 3, **TINY)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9), loss="sparse_categorical_crossentropy")
    directory = zoo.save_preset(model, str(tmp_path / "compiled"), card={"name": "compiled"})
    with open(os.path.join(directory, CONFIG_FILE)) as handle:
        config = json.load(handle)
    assert config["compile_config"] == {} and "SGD" not in json.dumps(config)
    restored = zoo.load(directory)
    assert not restored.compiled
    # An optimizer class no installed module holds, as a PyTorch preset's is where PyTorch is missing.
    config["compile_config"] = {"optimizer": {"module": "not_installed_backend.optimizers", "class_name": "SGD",
                                              "config": {}, "registered_name": None}, "loss": "mse"}
    with open(os.path.join(directory, CONFIG_FILE), "w") as handle:
        json.dump(config, handle)
    pixels = np.random.default_rng(2).uniform(0, 255, (2, 16, 16, 1)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(zoo.load(directory)(pixels)), np.asarray(model(pixels)), atol=1e-6)


def test_a_card_whose_task_contradicts_the_config_is_refused(copied):
    card = preset_format.read_card(copied)
    card["task"] = "retrieval"
    with open(os.path.join(copied, "metadata.json"), "w") as handle:
        json.dump(card, handle)
    with pytest.raises(ValueError, match="states task 'classification', not 'retrieval'"):
        zoo.load(copied)


def test_the_task_survives_keras_files_and_json(tmp_path):
    model = zoo.embedding_model("small_convnet", "gap", 4, **TINY)
    assert model_task(model) == "retrieval"
    assert model_task(keras.models.model_from_json(model.to_json())) == "retrieval"
    path = str(tmp_path / "embedding.keras")
    model.save(path)
    assert model_task(keras.saving.load_model(path)) == "retrieval"
    assert model_task(zoo.few_shot_model("small_convnet", "protonet", 3, **TINY)) == "few_shot"


def test_export_reads_the_stated_task_not_the_layer_names():
    model = zoo.image_classifier("small_convnet", "mpw", 3, head_kwargs={"num_proxies": 2}, **TINY)
    assert export.infer_task(model) == "classification"
    same_layers = keras.Model(model.inputs, model.outputs)  # the zoo's layer names, no stated task
    assert export.infer_task(same_layers) == "generic"
    assert export.serving_spec(same_layers).output_names == ("output_0",)
    assert export.serving_spec(with_task(same_layers, "retrieval")).output_names == ("embeddings",)
    assert export.serving_spec(model, task="retrieval").task == "retrieval"  # task= overrides


def test_export_command_takes_the_task_from_the_card(copied):
    _, name, task, preset = export_command._load(copied)
    assert (name, task) == ("copy", "classification") and preset == zoo.registry.PRESETS[NAME]  # the card's spec


def test_walk_layers_reaches_nested_models_and_sub_layers():
    structured = ot_layers.StructuredFC(3, 4, head={"method": "sinkhorn"})
    inputs = keras.Input((2, 2, 5))
    inner = keras.Model(inputs, structured(inputs), name="inner")
    outer = keras.Model(inputs, inner(inputs))
    layers = list(walk_layers(outer))
    assert inner in layers and structured in layers and structured.head in layers and outer not in layers
    assert len(layers) == len({id(layer) for layer in layers})
    assert find_layer(outer, ot_layers.StructuredFC) is structured


@pytest.mark.parametrize("layer, reason", [
    (lambda: ot_layers.EMDHead(method="exact"), 'method="sinkhorn"'),
    (lambda: ot_layers.StructuredFC(2, 4, head={"method": "exact"}), 'method="sinkhorn"'),
    (lambda: ot_layers.ManifoldProxies(3, 4), "export the embedding model instead"),
    (lambda: ot_layers.PatchExtractor(mode="sampling"), 'export with mode="grid"'),
    (lambda: ot_layers.EMDHead(method="sinkhorn"), None),
    (lambda: ot_layers.GeneralizedSumPooling(4), None),
    (lambda: zoo.L2Normalization(), None),
])
def test_layers_share_one_export_blocker(layer, reason):
    layer = layer()
    assert isinstance(layer, ExportableLayer)
    assert type(layer).export_blocker is ExportableLayer.export_blocker  # one property, no per-layer copy
    if reason is None:
        assert layer.export_blocker is None
    else:
        assert reason in layer.export_blocker


def test_the_directory_that_goes_with_weights(tmp_path):
    """A card and a training log go with a preset directory or its model.weights.h5, not with a weights file of
    another name or a URL."""
    from zoo.preset_format import WEIGHTS_FILE, is_weights_url, weights_directory

    assert weights_directory(str(tmp_path)) == str(tmp_path)
    assert weights_directory(os.path.join(str(tmp_path), WEIGHTS_FILE)) == str(tmp_path)
    assert weights_directory(WEIGHTS_FILE) == "."
    assert weights_directory(os.path.join(str(tmp_path), "other.weights.h5")) is None
    assert weights_directory(f"https://example.org/{WEIGHTS_FILE}") is None
    assert is_weights_url("http://example.org/w.weights.h5") and not is_weights_url(str(tmp_path))


def test_an_error_while_reading_a_download_is_a_weights_download_error(monkeypatch):
    """Keras wraps a refused connection or an HTTP error; a timeout or a reset while reading comes as it is."""
    def fail(*args, **kwargs):
        raise TimeoutError("The read operation timed out")

    monkeypatch.setattr(keras.utils, "get_file", fail)
    with pytest.raises(zoo.WeightsDownloadError, match=r"could not fetch https://example.invalid/m.weights.h5 \(The "
                                                       r"read operation timed out\)"):
        zoo.load(NAME, weights="https://example.invalid/m.weights.h5")


@pytest.mark.parametrize("config", [{}, {"module": "keras.layers", "class_name": "Dense", "config": {"units": 3}},
                                    {"class_name": "TaskModel", "registered_name": "ot_layers>TaskModel"}],
                         ids=["empty", "a_layer", "no_config"])
def test_a_config_json_that_is_no_model_is_a_preset_format_error(config, copied):
    """Valid JSON that Keras deserializes into something other than a model (a dict, a Dense layer) ended in an
    AttributeError traceback (``'dict' object has no attribute 'inputs'``)."""
    with open(os.path.join(copied, CONFIG_FILE), "w") as handle:
        json.dump(config, handle)
    with pytest.raises(preset_format.PresetFormatError, match=r"^the model config '.*config\.json' does not describe "
                                                              r"a model Keras can build: it gives a (dict|Dense), not "
                                                              r"a model$"):
        zoo.load(copied)


def _tiny(head="gap_fc"):
    return zoo.image_classifier("small_convnet", head, 3, **TINY)


def _contents(directory):
    return {name: open(os.path.join(directory, name), "rb").read() for name in sorted(os.listdir(directory))}


def test_save_preset_refuses_to_replace_a_preset_unless_told(tmp_path):
    """zoo.save_preset replaced any preset without a word (a packaged one too), as the command line does not."""
    directory = zoo.save_preset(_tiny(), str(tmp_path / "mine"), card={"name": "mine"})
    before = _contents(directory)
    with pytest.raises(ValueError, match=r"^`directory` '.*mine' holds a preset already \(metadata.json, "
                                         r"config.json\); write into another directory, or pass overwrite=True"):
        zoo.save_preset(_tiny("mpw"), directory, card={"name": "other"})
    assert _contents(directory) == before
    packaged = shutil.copytree(loading.preset_dir(NAME), str(tmp_path / "packaged"))  # as the package directory
    os.remove(os.path.join(packaged, "metadata.json"))  # a config alone is a preset's too
    with pytest.raises(ValueError, match=r"holds a preset already \(config.json\)"):
        zoo.save_preset(_tiny(), packaged, card={"name": "other"})
    with pytest.raises(ValueError, match="^`overwrite` must be True or False"):
        zoo.save_preset(_tiny(), directory, card={"name": "other"}, overwrite="yes")
    other = _tiny("mpw")
    zoo.save_preset(other, directory, card={"name": "other"}, overwrite=True)
    assert preset_format.read_card(directory)["name"] == "other" and sorted(os.listdir(directory)) == [
        "config.json", "metadata.json", "model.weights.h5"]
    pixels = np.random.default_rng(3).uniform(0, 255, (2, 16, 16, 1)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(zoo.load(directory)(pixels)), np.asarray(other(pixels)), atol=1e-6)


def test_a_failed_write_leaves_the_earlier_preset_intact(tmp_path, monkeypatch):
    """The files were written in place: weights that failed to write (a full disk) left the new config.json beside
    the old weights, a preset that no longer loaded."""
    directory = zoo.save_preset(_tiny(), str(tmp_path / "mine"), card={"name": "mine"})
    before = _contents(directory)

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(keras.Model, "save_weights", disk_full)
    with pytest.raises(OSError, match="No space left"):
        zoo.save_preset(_tiny("mpw"), directory, card={"name": "other"}, overwrite=True)
    assert _contents(directory) == before  # nor any temporary file left
    with pytest.raises(OSError, match="No space left"):
        zoo.save_preset(_tiny(), str(tmp_path / "new"), card={"name": "new"})
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()
    assert preset_format.read_card(directory)["name"] == "mine" and model_task(zoo.load(directory))


def test_dict_outputs_keep_their_names_through_a_preset(tmp_path):
    """with_task rebuilt the model from its flat outputs: a dict of named outputs came back as a list."""
    inputs = keras.Input((4,), name="x")
    model = keras.Model(inputs, {"logits": keras.layers.Dense(3, name="logits")(inputs),
                                 "embedding": keras.layers.Dense(2, name="embedding")(inputs)})
    x = np.ones((2, 4), np.float32)
    expected = {key: np.asarray(value) for key, value in model(x).items()}
    assert sorted(with_task(model, "generic")(x)) == ["embedding", "logits"]
    restored = zoo.load(zoo.save_preset(model, str(tmp_path / "named"), card={"task": "generic"}))(x)
    assert isinstance(restored, dict) and sorted(restored) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(np.asarray(restored[key]), value, atol=1e-6)


class _Subclassed(keras.Model):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(x)


def _subclassed():
    model = _Subclassed()
    model(np.zeros((1, 4), np.float32))
    return model


def _with_lambda():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Lambda(lambda t: t * 2)(inputs))


@pytest.mark.parametrize("model, message", [
    (lambda: keras.Sequential([keras.layers.Dense(3)]), "is a Sequential model whose input is not known yet"),
    (_subclassed, "must be a functional model .* got the subclassed _Subclassed"),
    (_with_lambda, "cannot be saved as a preset: its config does not rebuild as zoo.load reads it back: .*Lambda"),
], ids=["unbuilt_sequential", "subclassed", "lambda"])
def test_save_preset_refuses_a_model_it_cannot_write_or_read_back(model, message, tmp_path):
    """An unbuilt Sequential or a subclassed model ended in AttributeError; a Lambda layer was written into a preset
    that zoo.load (safe mode) then refused."""
    with pytest.raises(ValueError, match=f"^`model` {message}"):
        zoo.save_preset(model(), str(tmp_path / "preset"), card={"task": "generic"})
    assert not (tmp_path / "preset").exists()


def test_a_built_sequential_saves_and_loads(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    x = np.ones((2, 4), np.float32)
    restored = zoo.load(zoo.save_preset(model, str(tmp_path / "sequential"), card={"task": "generic"}))
    np.testing.assert_allclose(np.asarray(restored(x)), np.asarray(model(x)), atol=1e-6)


def _set_sha256(directory, value):
    card = preset_format.read_card(directory)
    card["weights_sha256"] = value
    with open(os.path.join(directory, "metadata.json"), "w") as handle:
        json.dump(card, handle)


def test_a_card_sha256_in_upper_case_is_the_same_sha256(copied):
    """Get-FileHash prints upper case: the right digest was reported as corrupted weights."""
    _set_sha256(copied, " " + zoo.model_card(NAME)["weights_sha256"].upper() + "\n")
    np.testing.assert_array_equal(np.asarray(zoo.load(copied)(X)), np.asarray(zoo.load(NAME)(X)))
    zoo.load(NAME, weights=copied)  # the card beside the weights, read by load_weights


@pytest.mark.parametrize("value", [123, "abc", ["x"], "g" * 64])
def test_a_card_sha256_that_is_no_sha256_is_a_format_error_not_corruption(value, copied):
    _set_sha256(copied, value)
    message = r"`weights_sha256` must be the weights' sha256 \(64 hex digits\), got "
    with pytest.raises(preset_format.PresetFormatError, match=rf"^the card of '.*copy': {message}"):
        zoo.load(copied)
    with pytest.raises(preset_format.PresetFormatError, match=rf"^the card that goes with the weights .*: {message}"):
        zoo.load(NAME, weights=copied)


def test_save_preset_leaves_a_seeded_program_as_it_was(tmp_path):
    """save_preset rebuilds the model from its config to check that it loads back; the rebuilt layers drew their
    default seeds from Python's random module, so weights and keras.random draws made after saving changed."""
    import keras

    import zoo

    def program(save):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4,))
        model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
        if save:
            zoo.save_preset(model, str(tmp_path / f"p{len(os.listdir(tmp_path))}"), card={"task": "generic"})
        layer = keras.layers.Dense(3)
        layer.build((None, 4))
        return np.asarray(layer.kernel), np.asarray(keras.random.uniform((3,)))

    without, saved = program(False), program(True)
    np.testing.assert_array_equal(without[0], saved[0])
    np.testing.assert_array_equal(without[1], saved[1])
