"""The layers' signals reach the epoch logs, CSVLogger and TensorBoard (training.layer_signals.LayerSignals)."""
import glob
import os

import keras
import numpy as np
import tensorflow as tf

import zoo
from ot_layers.layers.multi_proxy_wasserstein import MultiProxyWasserstein
from ot_layers.tensor_ops import find_layer, flatten_feature_map
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

    # Independent of the callback: the solver on the same cost stops after exactly that many updates -- one fewer
    # leaves a problem above the threshold.
    head = find_layer(model, MultiProxyWasserstein)
    features = keras.Model(model.inputs[0], head.input)(x[:16], training=False)
    _, _, result = head.matcher.match(flatten_feature_map(tf.convert_to_tensor(features)), head.proxies)
    k = int(iterations[-1])
    assert int(np.max(result.iterations)) == k
    assert history.history["mpw_head_marginal_error"][-1] <= 0.01 or k == head.matcher.max_iter
    if k > 1:
        fewer = head.matcher.max_iter, head.matcher.threshold
        head.matcher.max_iter = k - 1
        _, _, short = head.matcher.match(flatten_feature_map(tf.convert_to_tensor(features)), head.proxies)
        head.matcher.max_iter, head.matcher.threshold = fewer
        assert int(np.max(short.iterations)) == k - 1 and float(tf.reduce_max(short.error)) > 0.0


def test_probe_images_must_be_a_batch():
    import pytest

    with pytest.raises(ValueError, match="probe_images"):
        LayerSignals(np.zeros((0, 28, 28, 1)))
