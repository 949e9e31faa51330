"""The layers' signals reach the epoch logs, CSVLogger and TensorBoard (ot_layers.callbacks.layer_signals.LayerSignals),
and every training run's log.csv."""
import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import zoo
from ot_layers.layers.generalized_sum_pooling import GeneralizedSumPooling
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.tensor_ops import find_layer, flatten_feature_map, layer_input_model
from ot_layers.callbacks.layer_signals import LayerSignals


def _tensorboard_scalars(directory):
    found = {}
    for path in glob.glob(os.path.join(directory, "train", "events*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if not value.tag.startswith("epoch_"):  # the model's config is also written, as text
                    continue
                found.setdefault(value.tag, []).append(float(tf.make_ndarray(value.tensor)))
    return found


def test_mpw_iterations_are_logged_to_tensorboard_and_are_what_the_solver_needs(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (64, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 3, 64)
    model = zoo.image_classifier("small_convnet", "mpw", 3, input_shape=(28, 28, 1),
                                 backbone_kwargs={"width": 8, "feature_dim": 8}, head_kwargs={"threshold": 0.01})
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, y, epochs=2, batch_size=32, verbose=0, callbacks=[
        LayerSignals(x[:16]), keras.callbacks.TensorBoard(str(tmp_path))])
    iterations = history.history["mpw_head_sinkhorn_iterations"]
    assert len(iterations) == 2 and iterations[-1] >= 1
    scalars = _tensorboard_scalars(str(tmp_path))
    assert scalars["epoch_mpw_head_sinkhorn_iterations"] == iterations

    # Independent of the callback: the solver on the same cost stops after exactly that many updates. An update
    # measures the error of the potentials it starts from, so a solve stops one update after the one that met the
    # threshold: two fewer updates leave a problem above it.
    head = find_layer(model, MultiProxyWasserstein)
    features = keras.Model(model.inputs[0], head.input)(x[:16], training=False)
    _, _, result = head.matcher.match(flatten_feature_map(tf.convert_to_tensor(features)), head.proxies)
    k = int(iterations[-1])
    assert int(np.max(result.iterations)) == k
    assert history.history["mpw_head_marginal_error"][-1] <= 0.01 or k == head.matcher.max_iter
    assert k > 2, k  # the cosine cost at the default epsilon takes several updates
    fewer = head.matcher.max_iter, head.matcher.threshold
    head.matcher.max_iter = k - 2
    _, _, short = head.matcher.match(flatten_feature_map(tf.convert_to_tensor(features)), head.proxies)
    head.matcher.max_iter, head.matcher.threshold = fewer
    assert int(np.max(short.iterations)) == k - 2
    assert float(tf.reduce_max(short.error)) > head.matcher.threshold


def test_gsp_transport_iterations_are_what_its_partial_transport_needs_per_image():
    """A GSP embedding model's logs hold its partial transport's largest iteration count and mean final error on the
    probe images; solving each probe image apart, the largest count is the same, and one iteration fewer leaves
    that image's error above the threshold."""
    rng = np.random.default_rng(1)
    x = rng.uniform(0, 255, (48, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 3, 48)
    model = zoo.embedding_model("small_convnet", "gsp", 8, input_shape=(28, 28, 1),
                                backbone_kwargs={"width": 8, "feature_dim": 8},
                                pooling_kwargs={"num_prototypes": 4, "epsilon": 0.1, "threshold": 1e-3,
                                                "max_iter": 200})
    model.compile("sgd", loss=lambda labels, embeddings: keras.ops.mean(embeddings[:, 0]))
    history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[LayerSignals(x[:8])])
    iterations, error = history.history["gsp_transport_iterations"], history.history["gsp_marginal_error"]
    assert len(iterations) == 2 and history.history["gsp_prototypes_initialized"] == [0.0, 0.0]

    layer = find_layer(model, GeneralizedSumPooling)
    features = flatten_feature_map(keras.Model(model.inputs[0], layer.input)(x[:8], training=False))
    alone = [layer.transport(features[i:i + 1]) for i in range(8)]  # each image on its own
    counts = [int(np.asarray(result.iterations)[0]) for result in alone]
    assert max(counts) == iterations[-1] and 1 < iterations[-1] < layer.max_iter
    # (float32 errors far below the threshold: a batch and a lone image may round them apart in the last digits)
    np.testing.assert_allclose(error[-1], np.mean([float(np.asarray(r.error)[0]) for r in alone]), rtol=1e-4,
                               atol=1e-6)
    hardest = int(np.argmax(counts))
    layer.max_iter = counts[hardest] - 1
    assert float(np.asarray(layer.transport(features[hardest:hardest + 1]).error)[0]) > layer.threshold


def test_a_layer_inside_a_nested_model_is_read_through_the_outer_graph():
    """``layer_input_model`` reaches a layer two models deep, through the call of each nested model that the outer
    graph holds (also when a nested model is called in another graph too); ``keras.Model(outer.inputs,
    layer.input)``, what the callbacks used, is refused by Keras there. A training model around a GSP embedding
    model then logs the GSP signals (this failed: "Output ... is not connected to inputs")."""
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 255, (24, 28, 28, 1)).astype("float32")
    embedder = zoo.embedding_model("small_convnet", "gsp", 8, input_shape=(28, 28, 1),
                                   backbone_kwargs={"width": 8, "feature_dim": 8},
                                   pooling_kwargs={"num_prototypes": 4, "epsilon": 0.1, "max_iter": 50})
    layer = find_layer(embedder, GeneralizedSumPooling)
    direct = keras.Model(embedder.inputs, layer.input).predict(x, verbose=0)
    middle_inputs = keras.Input((28, 28, 1))
    middle = keras.Model(middle_inputs, keras.layers.Dense(3)(embedder(middle_inputs)))
    other = keras.Input((28, 28, 1))
    keras.Model(other, embedder(other))  # the embedder called in another graph too
    inputs = keras.Input((28, 28, 1))
    outer = keras.Model(inputs, middle(inputs))
    with pytest.raises(ValueError):
        keras.Model(outer.inputs, layer.input)
    np.testing.assert_array_equal(layer_input_model(outer, layer).predict(x, verbose=0), direct)

    outer.compile("sgd", loss=lambda labels, outputs: keras.ops.mean(outputs[:, 0]))
    history = outer.fit(x, np.zeros(24), epochs=1, batch_size=12, verbose=0, callbacks=[LayerSignals(x[:8])])
    trained = keras.Model(embedder.inputs, layer.input)(x[:8], training=False)  # the features after the epoch
    counts = [int(np.asarray(layer.transport(flatten_feature_map(trained[i:i + 1])).iterations)[0])
              for i in range(8)]
    assert history.history["gsp_transport_iterations"] == [max(counts)]


@pytest.mark.parametrize("method", ["sinkhorn", "exact"])
def test_a_structured_fc_reports_its_heads_signals(method):
    """``StructuredFC`` calls its ``EMDHead`` itself (no graph node): the callback reports the head's transport
    between the feature maps the layer receives and its class nodes, under the layer's name (this crashed at the
    first epoch's end: "The layer emd has never been called"). Each query solved alone gives the same count."""
    from ot_layers import StructuredFC
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (8, 4, 4, 1)).astype("float32")
    inputs = keras.Input((4, 4, 1))
    layer = StructuredFC(2, 16, head={"method": method}, name="sfc")
    model = keras.Model(inputs, layer(keras.layers.Conv2D(3, 1)(inputs)))
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = model.fit(x, np.array([0, 1] * 4), epochs=1, verbose=0, callbacks=[LayerSignals(x[:4])])
    features = flatten_feature_map(layer_input_model(model, layer, model.inputs[0])(x[:4], training=False))
    nodes = flatten_feature_map(keras.ops.convert_to_tensor(layer.nodes))
    alone = [layer.head.transport(features[i:i + 1], nodes)[3] for i in range(4)]
    converged = np.mean([np.asarray(result.converged, np.float32) for result in alone])
    assert history.history["sfc_converged"] == [pytest.approx(converged)]
    if method == "sinkhorn":
        assert history.history["sfc_sinkhorn_iterations"] == [max(int(np.max(r.iterations)) for r in alone)]
    else:
        assert converged == 1.0 and history.history["sfc_marginal_error"][0] < 1e-6
    assert not any(key.startswith("emd_") for key in history.history)


def test_probe_images_must_be_a_batch():
    with pytest.raises(ValueError, match="probe_images"):
        LayerSignals(np.zeros((0, 28, 28, 1)))


@pytest.mark.parametrize("probe, message", [
    (np.zeros((4, 5, 5, 3), np.float32), r"takes inputs of shape \(None, 6, 6, 3\), got shape \(4, 5, 5, 3\)"),
    ([np.zeros((4, 6, 6, 3), np.float32), np.zeros(4)], "takes 1 input"),
])
def test_a_probe_that_does_not_fit_the_model_is_refused_before_the_first_epoch(probe, message):
    """The shape check runs when training begins (Keras' own error came at the first epoch's end, naming an
    internal sub-model), so ``fit`` stops before any step."""
    inputs = keras.Input((6, 6, 3))
    flat = keras.layers.Reshape((36, 3))(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(GeneralizedSumPooling(num_prototypes=2)(flat)))
    model.compile("sgd", "sparse_categorical_crossentropy")
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    with pytest.raises(ValueError, match=r"`probe_images`.*" + message):
        model.fit(np.zeros((8, 6, 6, 3)), np.zeros(8), epochs=1, verbose=0,
                  callbacks=[LayerSignals(probe), counter])
    assert steps == []


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_every_training_run_logs_the_signals_that_its_saved_model_gives(tmp_path, capsys):
    """``otzoo train`` of the MPW preset, without ``--tensorboard``: log.csv holds the head's Sinkhorn iterations and
    marginal error for every epoch, and the last epoch's are what the saved preset's head, loaded afresh, needs on
    the first 64 training images."""
    from explain.signals import read_training_log
    from otzoo import cli
    from training.data.fashion_mnist import load_fashion_mnist

    out = tmp_path / "run"
    assert cli.main(["train", "resnet20_mpw_fashion_mnist", "--limit", "256", "--epochs", "2", "--batch-size", "64",
                     "--out", str(out)]) == 0, capsys.readouterr().err
    log = read_training_log(str(out / "log.csv"))
    assert log["epoch"].astype(int).tolist() == [0, 1]
    assert np.all(np.isfinite(log["val_accuracy"]))  # the rows line up with the header

    model = zoo.load(str(out))
    head = find_layer(model, MultiProxyWasserstein)
    images, _ = load_fashion_mnist("train", limit=64, normalize=False)
    features = keras.Model(model.inputs[0], head.input)(images.astype("float32"), training=False)
    _, _, result = head.matcher.match(flatten_feature_map(tf.convert_to_tensor(features)), head.proxies)
    assert log["mpw_head_sinkhorn_iterations"][-1] == int(np.max(result.iterations))
    np.testing.assert_allclose(log["mpw_head_marginal_error"][-1], float(np.mean(result.error)), rtol=1e-5)
    assert np.all((log["mpw_head_sinkhorn_iterations"] >= 1)
                  & (log["mpw_head_sinkhorn_iterations"] <= head.matcher.max_iter))
