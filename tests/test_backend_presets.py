"""The pretrained presets on the JAX and PyTorch backends (slow: the whole Fashion-MNIST test split).

Each preset's weights load under ``KERAS_BACKEND=jax`` and ``torch`` in a fresh process and ``otzoo evaluate``
reproduces its card: accuracy and MAP@R within 0.3 points, few-shot accuracy within the card's 95 % interval (the
episodes are the same on every backend). The MPW preset's logits on 500 test images match TensorFlow's within 1e-4
relative to their scale. A preset fine-tuned one epoch with ``model.fit`` on JAX or PyTorch lowers its loss on the
slice, and its weights load in TensorFlow and export (SavedModel, ONNX) with parity <= 1e-5; so does the model ``otzoo
demo`` fine-tunes on PyTorch. ``otzoo train`` on JAX (one device, and data parallel over two host devices) and PyTorch
writes a card that names the backend and the device layout, and whose metrics ``otzoo evaluate`` reproduces on
TensorFlow from the weights it wrote (a few-shot preset's too); and ``otzoo train``, ``evaluate`` and ``fine-tune``
run on JAX and PyTorch, for a classification and the DeepEMD few-shot preset, in a process where TensorFlow cannot
be imported (``tests/backends/train_without_tensorflow.py``), as on a GPU machine without it. A TFDS data set (its
``tf.data`` pipeline, on TFDS's offline mock data) trains on JAX and PyTorch through ``model.fit`` and evaluates the
same on TensorFlow. ``otzoo explain`` on JAX and PyTorch draws the pictures TensorFlow draws. A ``.keras`` file saved
on PyTorch after ``compile`` loads on TensorFlow with ``compile=False`` and predicts as it did on PyTorch.
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from explain.signals import read_training_log
from zoo.loading import model_card

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORTED = ["resnet20_mpw_fashion_mnist", "resnet20_gap_fashion_mnist", "resnet20_hyperspherical_fashion_mnist",
          "resnet20_gap_retrieval_fashion_mnist", "resnet20_gsp_retrieval_fashion_mnist",
          "resnet20_protonet_fewshot_fashion_mnist"]
pytestmark = [pytest.mark.slow, pytest.mark.fashion_mnist]


# A guard against a hung process, not a time limit: the DeepEMD card's 2,000 episodes on PyTorch (eager) ran past 20
# minutes on a loaded 2-core machine, where Keras' torch convolutions on channels-last images cost most of the time.
HANG_GUARD_S = 3600


def _run(args, backend, cwd, **environment):
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3", **environment)
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=HANG_GUARD_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _metrics_reproduced_on_tensorflow(card, out, cwd, command=("-m", "otzoo")):
    printed = _run([*command, "evaluate", out], "tensorflow", cwd)
    for metric, value in card["metrics"].items():
        found = float(re.search(rf"{metric} ([0-9.]+)", printed).group(1))
        value = value["mean"] if isinstance(value, dict) else value  # few-shot: the mean accuracy of its episodes
        assert abs(found - value) <= 0.003, (metric, found, value, printed)


# Every preset on JAX and PyTorch; the DeepEMD preset's 2,000 episodes take about 2 minutes on JAX (a compiled
# episode function) and 6 on PyTorch (eager). CI runs one preset per backend (the others are marked `long`).
IN_CI = {("resnet20_mpw_fashion_mnist", "jax"), ("resnet20_gsp_retrieval_fashion_mnist", "torch")}
CARD_RUNS = [pytest.param(preset, backend, marks=[] if (preset, backend) in IN_CI else [pytest.mark.long])
             for preset in PORTED + ["resnet20_emd_fewshot_fashion_mnist"] for backend in ("jax", "torch")]


@pytest.mark.parametrize("preset, backend", CARD_RUNS)
def test_preset_reproduces_its_card(preset, backend, tmp_path):
    pytest.importorskip(backend)
    out = _run(["-m", "otzoo", "evaluate", preset], backend, str(tmp_path))
    card = model_card(preset)["metrics"]
    found = 0
    for name, value in re.findall(r": (\w+) ([0-9.]+)(?: \+- [0-9.]+)? \(card", out):
        if name not in card:
            continue
        expected = card[name]
        if isinstance(expected, dict):  # few-shot: within the card's 95 % interval
            assert abs(float(value) - expected["mean"]) <= expected["ci95"], (name, value, expected)
            found += 1
        elif name in ("accuracy", "map_at_r"):
            assert abs(float(value) - expected) <= 0.003, (name, value, expected)
            found += 1
    assert found, out  # the card's headline metric was compared


MPW_LOGITS = """
import sys, numpy as np, zoo
from ot_layers.callbacks.layer_signals import LayerSignals
from training.data.fashion_mnist import load_fashion_mnist
images, _ = load_fashion_mnist("test", limit=500, normalize=False)
model = zoo.load("resnet20_mpw_fashion_mnist")
signals = LayerSignals(images[:64])
signals.set_model(model)
found = signals.signals()
np.savez(sys.argv[1], logits=np.asarray(model.predict(images, batch_size=250, verbose=0)),
         iterations=found["mpw_head_sinkhorn_iterations"], error=found["mpw_head_marginal_error"])
"""


def test_mpw_logits_and_signals_match_tensorflow_on_every_backend(tmp_path):
    """The MPW preset on 500 test images: logits within 1e-4 of TensorFlow's scale; its head's signals
    (``LayerSignals``, the ones every run logs) on 64 of them: the same Sinkhorn iterations, the marginal error
    within 1e-3 relative."""
    found = {}
    for backend in ("tensorflow", "jax", "torch"):
        pytest.importorskip(backend)
        path = str(tmp_path / f"{backend}.npz")
        _run(["-c", MPW_LOGITS, path], backend, str(tmp_path))
        found[backend] = np.load(path)
    reference = found["tensorflow"]
    scale = np.abs(reference["logits"]).max()
    for backend in ("jax", "torch"):
        assert np.abs(found[backend]["logits"] - reference["logits"]).max() <= 1e-4 * scale, backend
        assert found[backend]["iterations"] == reference["iterations"] >= 1, backend
        np.testing.assert_allclose(found[backend]["error"], reference["error"], rtol=1e-3, err_msg=backend)


@pytest.mark.long
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_fine_tuned_on_backend_exports_from_tensorflow(backend, tmp_path):
    """On PyTorch the compiled optimizer is a class of Keras' torch backend: the preset leaves it out, else loading
    it on TensorFlow would import PyTorch's compiler beside TensorFlow (the process aborts)."""
    pytest.importorskip(backend)
    tuned = str(tmp_path / "tuned")
    _run(["-m", "otzoo", "fine-tune", "resnet20_mpw_fashion_mnist", "--limit", "512", "--out", tuned], backend,
         str(tmp_path))
    with open(os.path.join(tuned, "metadata.json")) as handle:
        fine_tuned = json.load(handle)["fine_tuned"]
    before, after = fine_tuned["loss_on_slice_before_after"]
    assert fine_tuned["backend"] == backend and after < before
    out = _run(["-m", "otzoo", "export", tuned, "--out", str(tmp_path / "export")], "tensorflow", str(tmp_path))
    assert "parity holds" in out, out


@pytest.mark.long
def test_demo_on_torch_saves_a_preset_that_exports_from_tensorflow(tmp_path):
    pytest.importorskip("torch")
    out = str(tmp_path / "demo")
    printed = _run(["-m", "otzoo", "demo", "--limit", "256", "--test-limit", "256", "--out", out], "torch",
                   str(tmp_path))
    assert re.search(r"^3\. model\.fit, 1 epoch on the first 256 training images \(loss", printed, re.M), printed
    assert f"otzoo --backend tensorflow export {os.path.join(out, 'fine_tuned')}" in printed, printed
    with open(os.path.join(out, "fine_tuned", "metadata.json")) as handle:  # as otzoo fine-tune's card says it
        assert json.load(handle)["fine_tuned"]["fitted"] == "the first 256 training images"
    exported = _run(["-m", "otzoo", "--backend", "tensorflow", "export", os.path.join(out, "fine_tuned"), "--out",
                     str(tmp_path / "export")], "tensorflow", str(tmp_path))
    assert "parity holds" in exported, exported


@pytest.mark.long
@pytest.mark.parametrize("backend, preset, devices, layout, options, signals", [
    ("jax", "resnet20_mpw_fashion_mnist", 2, "data_parallel, 2 device(s)", (),
     ("mpw_head_sinkhorn_iterations", "mpw_head_marginal_error")),
    ("jax", "resnet20_hyperspherical_fashion_mnist", 2, "data_parallel, 2 device(s)", (), ("prototype_changes",)),
    ("torch", "resnet20_gsp_retrieval_fashion_mnist", 1, "default, 1 device(s)", (),
     ("gsp_prototypes_initialized", "gsp_transport_iterations", "gsp_marginal_error")),
    ("torch", "resnet20_protonet_fewshot_fashion_mnist", 1, "one_device, 1 device(s)", ("--episodes", "3"), ()),
])
def test_otzoo_train_on_backend_evaluates_the_same_on_tensorflow(backend, preset, devices, layout, options, signals,
                                                                 tmp_path):
    """One epoch of ``otzoo --backend B train`` on a slice (few-shot: one pre-training epoch and 3 meta-training
    episodes, on one device): the card names the backend and the device layout (JAX on two host devices:
    ``keras.distribution`` data parallel), log.csv holds the layers' ``signals`` (finite), and TensorFlow reproduces
    its metrics from the weights (within 0.3 points: the backends' float sums differ in the last bits, which may
    flip a near tie)."""
    pytest.importorskip(backend)
    out = str(tmp_path / "run")
    environment = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"} if devices > 1 else {}
    _run(["-m", "otzoo", "--backend", backend, "train", preset, "--limit", "512", "--epochs", "1", *options, "--out",
          out], backend, str(tmp_path), **environment)
    with open(os.path.join(out, "metadata.json")) as handle:
        card = json.load(handle)
    assert card["backend"] == backend and f"keras.distribution ({layout}" in card["strategy"], card
    assert card["command"].startswith(f"otzoo --backend {backend} train {preset}")
    assert not os.path.exists(os.path.join(out, "backup"))  # the finished run's backup is removed
    if signals:
        log = read_training_log(os.path.join(out, "log.csv"))
        for column in signals:
            assert column in log and np.all(np.isfinite(log[column])), (column, log)
    _metrics_reproduced_on_tensorflow(card, out, str(tmp_path))


@pytest.mark.long
@pytest.mark.parametrize("backend, preset, dataset", [
    ("jax", "resnet20_gap_fashion_mnist", "cifar10"),
    ("torch", "resnet20_gsp_retrieval_fashion_mnist", "caltech_birds2011"),  # with GSP's prototype initialization
])
def test_tfds_data_set_trains_on_backend(backend, preset, dataset, tmp_path):
    """A TFDS data set's ``tf.data`` pipeline feeds ``model.fit`` on JAX and PyTorch (TensorFlow installed, the
    model on the other backend); TensorFlow reproduces the card's metrics on the same (mock) test images."""
    pytest.importorskip(backend)
    pytest.importorskip("tensorflow_datasets")
    out = str(tmp_path / "run")
    command = (os.path.join(ROOT, "tests", "backends", "otzoo_on_mock_tfds.py"),)
    _run([*command, "--backend", backend, "train", preset, "--dataset", dataset, "--image-size", "32", "--limit",
          "256", "--batch-size", "32", "--epochs", "1", "--out", out], backend, str(tmp_path))
    with open(os.path.join(out, "metadata.json")) as handle:
        card = json.load(handle)
    assert card["backend"] == backend and card["dataset"] == dataset and card["input_shape"] == [32, 32, 3], card
    _metrics_reproduced_on_tensorflow(card, out, str(tmp_path), command)


@pytest.mark.long
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_train_evaluate_fine_tune_without_tensorflow(backend, tmp_path):
    pytest.importorskip(backend)
    printed = _run([os.path.join(ROOT, "tests", "backends", "train_without_tensorflow.py"), str(tmp_path)], backend,
                   str(tmp_path))
    report = json.loads([line for line in printed.splitlines() if line.startswith("{")][-1])
    assert report["card_backend"] == backend and not report["tensorflow_loaded"] and not report["failures"], report


@pytest.mark.long
@pytest.mark.parametrize("backend, preset", [
    ("jax", "resnet20_mpw_fashion_mnist"), ("jax", "resnet20_emd_fewshot_fashion_mnist"),
    ("torch", "resnet20_gsp_retrieval_fashion_mnist"), ("torch", "resnet20_hyperspherical_fashion_mnist")])
def test_explain_draws_what_tensorflow_draws(backend, preset, tmp_path):
    """The same pictures as on TensorFlow, pixel for pixel but for rounding (the plans, weights and flows agree
    within float32 rounding; ``tests/backends/check_explain.py`` checks them against POT on every backend)."""
    pytest.importorskip(backend)
    pictures = {}
    for name in (backend, "tensorflow"):
        out = tmp_path / name
        _run(["-m", "otzoo", "explain", preset, "--test-index", "0", "1", "--gallery-size", "200", "--out", str(out)],
             name, str(tmp_path))
        pictures[name] = {file: np.asarray(Image.open(out / file).convert("L"), dtype=np.float64)
                          for file in sorted(os.listdir(out)) if file.endswith(".png")}
    assert pictures["tensorflow"] and sorted(pictures[backend]) == sorted(pictures["tensorflow"])
    for file, drawn in pictures["tensorflow"].items():
        assert pictures[backend][file].shape == drawn.shape, file
        assert np.abs(pictures[backend][file] - drawn).mean() < 0.05, file  # gray levels 0-255


# A model of the user's own: compiled and fitted on PyTorch, saved as one .keras file (model.save), then loaded on
# TensorFlow without its compile config, as docs/backends.md advises (the config names PyTorch's optimizer class).
SAVE_ON_TORCH = """
import json, sys, zipfile
import numpy as np, keras, zoo
model = zoo.build("resnet20_mpw_fashion_mnist", backbone="small_convnet")
model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = np.random.default_rng(0).integers(0, 256, (64, 28, 28, 1)).astype("float32")
model.fit(x, np.arange(64) % 10, epochs=1, batch_size=32, verbose=0)
model.save(sys.argv[1] + "/model.keras")
np.save(sys.argv[1] + "/x.npy", x[:16]); np.save(sys.argv[1] + "/logits.npy", model.predict(x[:16], verbose=0))
with zipfile.ZipFile(sys.argv[1] + "/model.keras") as archive:
    print(json.loads(archive.read("config.json"))["compile_config"]["optimizer"]["module"])
"""
LOAD_ON_TENSORFLOW = """
import sys
import numpy as np, keras, zoo
model = keras.saving.load_model(sys.argv[1] + "/model.keras", compile=False)
logits = model.predict(np.load(sys.argv[1] + "/x.npy"), verbose=0)
reference = np.load(sys.argv[1] + "/logits.npy")
print(float(np.max(np.abs(logits - reference)) / np.max(np.abs(reference))))
"""


def test_a_keras_file_saved_on_torch_after_compile_loads_on_tensorflow_without_its_compile_config(tmp_path):
    pytest.importorskip("torch")
    module = _run(["-c", SAVE_ON_TORCH, str(tmp_path)], "torch", str(tmp_path)).strip().splitlines()[-1]
    assert module.startswith("keras.src.backend.torch."), module  # why compile=False is needed on TensorFlow
    printed = _run(["-c", LOAD_ON_TENSORFLOW, str(tmp_path)], "tensorflow", str(tmp_path))
    relative = float(printed.strip().splitlines()[-1])
    assert relative <= 1e-4, relative
