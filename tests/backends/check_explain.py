"""``explain`` on the active Keras backend: the signals it pulls out of a model (MPW plans, GSP weights, EMD flows,
prototype geometry) reproduce the model's own outputs and agree with POT and NumPy computed independently; its
image resizing equals a NumPy restatement of bilinear resizing with half-pixel centres (a triangle filter widened by
the scale when shrinking, as antialiasing does); with matplotlib installed, ``explain_model`` writes its pictures.

    KERAS_BACKEND=torch python tests/backends/check_explain.py
"""
import importlib.util
import os
import tempfile

import keras
import numpy as np
import ot

from backend_tools import Report, numpy
import explain
import zoo
from ot_layers.tensor_ops import normalize_rows_np

SMALL = dict(width=8, feature_dim=16)
report = Report("explain")
rng = np.random.default_rng(0)


def images(count, shape=(28, 28, 1)):
    return rng.integers(0, 256, (count,) + shape).astype(np.float32)


def head_input(model, layer_name, inputs):
    outputs = keras.Model(model.inputs, model.get_layer(layer_name).input)(inputs)
    return [numpy(x) for x in outputs] if isinstance(outputs, (list, tuple)) else numpy(outputs)


keras.utils.set_random_seed(0)

# MultiProxyWasserstein: the plans sum back to the model's logits and equal POT's converged Sinkhorn on a cost built
# here in NumPy (1 - cos, uniform marginals, the layer's epsilon 0.1).
mpw = zoo.image_classifier("small_convnet", "mpw", 4, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                           head_kwargs=dict(num_proxies=2, threshold=0.0, max_iter=400))
batch = images(3)
plans = explain.mpw_plans(mpw, batch)
report.expect("mpw_shapes", plans.plans.shape == (3, 4, 49, 2) and plans.grid == (7, 7), str(plans.plans.shape))
report.measure("mpw_logits_vs_model", np.abs(plans.logits - mpw.predict(batch, verbose=0)).max(), 1e-4)
features = head_input(mpw, "mpw_head", batch).reshape(3, 49, -1).astype(np.float64)
proxies = numpy(mpw.get_layer("mpw_head").proxies).astype(np.float64)
worst = 0.0
for b in range(3):
    for k in range(4):
        cost = 1.0 - normalize_rows_np(features[b]) @ normalize_rows_np(proxies[k]).T
        reference = ot.sinkhorn(np.full(49, 1 / 49), np.full(2, 0.5), cost, 0.1, numItermax=5000, stopThr=1e-12)
        worst = max(worst, np.abs(plans.plans[b, k] - reference).max())
report.measure("mpw_plans_vs_pot", worst, 1e-5)

# GeneralizedSumPooling: the weights are a distribution over the cells and pool to the layer's own output.
gsp = zoo.embedding_model("small_convnet", "gsp", 8, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                          pooling_kwargs=dict(num_prototypes=4, epsilon=0.2))
pooled = numpy(keras.Model(gsp.inputs, gsp.get_layer("gsp").output)(batch))
weights = explain.gsp_weights(gsp, batch)
report.measure("gsp_weights_sum_error", np.abs(weights.weights.sum(1) - 1.0).max(), 1e-5)
report.expect("gsp_weights_nonnegative", np.all(weights.weights >= 0))
report.measure("gsp_pooled_vs_layer", np.abs(weights.pooled - pooled).max(), 1e-5)

# EMDHead, exact: the flows reproduce the logits, have the node weights as marginals, and cost what POT's exact
# EMD costs between the same node sets.
emd = zoo.few_shot_model("small_convnet", "emd", ways=3, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                         head_kwargs=dict(method="exact"))
episode = [images(2), images(3), np.arange(3, dtype=np.int32)]
flows = explain.emd_flows(emd, *episode)
report.measure("emd_logits_vs_model", np.abs(flows.logits - numpy(emd(episode))).max(), 1e-4)
query_maps, class_maps = head_input(emd, "emd_head", episode)
query_maps = query_maps.reshape(2, 49, -1).astype(np.float64)
class_maps = class_maps.reshape(3, 49, -1).astype(np.float64)
worst_value = worst_marginal = 0.0
for b in range(2):
    for k in range(3):
        centred_query = query_maps[b] - query_maps[b].mean(1, keepdims=True)
        centred_class = class_maps[k] - class_maps[k].mean(1, keepdims=True)
        cost = np.maximum(1.0 - normalize_rows_np(centred_query) @ normalize_rows_np(centred_class).T, 0.0)
        a, w = flows.query_weights[b, k].astype(np.float64), flows.support_weights[b, k].astype(np.float64)
        value = ot.emd2(a / a.sum(), w / w.sum(), cost)
        plan = flows.plans[b, k]
        worst_value = max(worst_value, abs(float(np.sum(plan * cost)) - value))
        worst_marginal = max(worst_marginal, np.abs(plan.sum(1) - a).max(), np.abs(plan.sum(0) - w).max())
report.measure("emd_flow_cost_vs_pot_emd2", worst_value, 1e-5)
report.measure("emd_flow_marginal_error", worst_marginal, 1e-6)

# HypersphericalPrototypes: the geometry is what the layer classifies with (cosines to the assigned prototypes).
hyper = zoo.image_classifier("small_convnet", "hyperspherical", 5, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                             head_kwargs=dict(dim=4))
layer = hyper.get_layer("hyperspherical_head")
layer.assignment.assign(np.array([2, 0, 1, 4, 3], dtype=np.int32))
geometry = explain.prototype_geometry(hyper)
prototypes = normalize_rows_np(numpy(layer.prototypes).astype(np.float64))
report.measure("prototypes_assigned_error", np.abs(geometry.assigned - prototypes[[2, 0, 1, 4, 3]]).max(), 1e-6)
embedding = numpy(keras.Model(hyper.inputs, hyper.get_layer("embedding").output)(batch))
report.measure("prototypes_logits_vs_model",
               np.abs(normalize_rows_np(embedding) @ geometry.assigned.T - hyper.predict(batch, verbose=0)).max(),
               1e-5)


def bilinear_weights(size_in, size_out, antialias):
    """``(size_out, size_in)`` weights of bilinear resizing with half-pixel centres: a triangle of half-width one
    input pixel, widened to ``size_in / size_out`` pixels when shrinking with antialiasing, normalized per output."""
    scale = size_out / size_in
    width = 1.0 / scale if antialias and scale < 1 else 1.0
    centres = (np.arange(size_out) + 0.5) / scale
    weights = np.maximum(0.0, 1.0 - np.abs((np.arange(size_in) + 0.5)[None, :] - centres[:, None]) / width)
    return weights / weights.sum(1, keepdims=True)


def resized(array, size, antialias):
    rows, cols = (bilinear_weights(n, m, antialias) for n, m in zip(array.shape[1:3], size))
    return np.einsum("ih,bhwc,jw->bijc", rows, array.astype(np.float64), cols)


# Images fitted to a 28x28 input (0-255 pixels): shrunk with antialiasing, enlarged; heat maps upsampled.
large, small = images(2, (64, 48, 1)), images(2, (20, 20, 1))
report.measure("prepare_shrink_vs_numpy", np.abs(explain.prepare_images(large, (28, 28, 1))
                                                 - np.clip(resized(large, (28, 28), True), 0, 255)).max(), 1e-3)
report.measure("prepare_enlarge_vs_numpy",
               np.abs(explain.prepare_images(small, (28, 28, 1)) - resized(small, (28, 28), False)).max(), 1e-3)
cells = rng.random((3, 7, 7))
report.measure("upsample_vs_numpy",
               np.abs(explain.upsample(cells, (28, 28)) - resized(cells[..., None], (28, 28), False)[..., 0]).max(),
               1e-5)

# The pictures (matplotlib; absent on a machine without the explain extra).
if importlib.util.find_spec("matplotlib") is None:
    report.record["explain_model"] = "skipped: matplotlib is not installed"
else:
    with tempfile.TemporaryDirectory() as out:
        written = explain.explain_model(mpw, out, images=batch[:2], labels=[0, 1], names=["a", "b"],
                                        gallery=images(6), gallery_labels=np.arange(6) % 4, k=3, dpi=40)
        sizes = [os.path.getsize(path) for paths in written.values() for path in paths]
        report.expect("explain_model_pictures", sorted(written) == ["mpw", "retrieval"] and len(sizes) == 3
                      and min(sizes) > 0, str(written))

report.finish()
