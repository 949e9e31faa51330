"""The DeepEMD family (solvers.emd exact and entropic, EMDHead, StructuredFC, PatchExtractor) on the active Keras
backend, against POT, finite differences and NumPy restatements of the documented formulas.

    KERAS_BACKEND=jax python tests/backends/check_emd.py
"""

import keras
import numpy as np
import ot
from keras import ops

from backend_tools import BACKEND, Report, central_difference, fit_and_round_trip, numpy, tensor, value_and_grad
from ot_layers import EMDHead, PatchExtractor, StructuredFC
from ot_layers.solvers import emd

report = Report("emd")
rng = np.random.default_rng(0)


def problems(batch=3, n=5, m=4):
    """Random continuous costs and weights (float64): a unique optimal flow and unique duals."""
    cost = rng.uniform(0.0, 1.0, (batch, n, m))
    a = rng.uniform(0.2, 1.0, (batch, n))
    b = rng.uniform(0.2, 1.0, (batch, m))
    return cost, a / a.sum(-1, keepdims=True), b / b.sum(-1, keepdims=True)


# Exact plans and costs against POT's network simplex (float64).
cost, a, b = problems()
result = emd(tensor(cost), tensor(a), tensor(b), method="exact")
plans = np.stack([ot.emd(a[k], b[k], cost[k]) for k in range(3)])
report.measure("exact_plan_vs_pot", np.abs(numpy(result.plan) - plans).max(), 1e-9)
report.measure("exact_cost_vs_pot", np.abs(numpy(result.cost) - (plans * cost).sum((-2, -1))).max(), 1e-9)
report.expect("exact_dtype_float64", all(numpy(x).dtype == np.float64 for x in (result.plan, result.cost, result.f,
                                                                                 result.g, result.error)),
              str([numpy(x).dtype for x in result[:4] + (result.error,)]))  # error was float32 on PyTorch
# The result vocabulary: the flow's marginal error, the simplex's optimality flag, iterations not counted (-1).
report.measure("exact_error_vs_plan", np.abs(numpy(result.error) - np.maximum(
    np.abs(plans.sum(-1) - a).sum(-1), np.abs(plans.sum(-2) - b).sum(-1))).max(), 1e-9)
report.expect("exact_converged", numpy(result.converged).dtype == np.bool_ and bool(numpy(result.converged).all()))
report.expect("exact_iterations_not_counted", numpy(result.iterations).dtype == np.int32
              and bool(np.all(numpy(result.iterations) == -1)))
result32 = emd(tensor(cost.astype(np.float32)), tensor(a.astype(np.float32)), tensor(b.astype(np.float32)),
               method="exact")
report.expect("exact_dtype_float32", numpy(result32.plan).dtype == np.float32)
batched = emd(tensor(cost.reshape(1, 3, 5, 4)), tensor(a), None, method="exact")
report.expect("exact_batch_shape", tuple(numpy(batched.plan).shape) == (1, 3, 5, 4)
              and tuple(numpy(batched.cost).shape) == (1, 3))
try:
    bad = cost.copy()
    bad[1, 2, 3] = np.nan
    emd(tensor(bad), tensor(a), tensor(b), method="exact")
    report.expect("exact_nan_raises", False, "no error")
except ValueError as error:
    report.expect("exact_nan_raises", "problem 1" in str(error), str(error))

# Danskin gradients of the exact cost against central differences (cost; mass-preserving weight directions).
weights = tensor(rng.normal(size=3))


def exact_loss(c, a_, b_):
    return ops.sum(emd(c, a_, b_, method="exact").cost * weights)


_, (d_cost, d_a, d_b) = value_and_grad(exact_loss, cost, a, b)
worst = 0.0
for _ in range(4):
    direction = rng.normal(size=cost.shape)
    exact = float(np.sum(d_cost * direction))
    numeric = central_difference(lambda c: exact_loss(c, tensor(a), tensor(b)), cost, direction)
    worst = max(worst, abs(exact - numeric) / max(1.0, abs(exact)))
for gradient_of, array, of in ((d_a, a, lambda x: exact_loss(tensor(cost), x, tensor(b))),
                               (d_b, b, lambda x: exact_loss(tensor(cost), tensor(a), x))):
    for _ in range(2):
        direction = rng.normal(size=array.shape)
        direction -= direction.mean(-1, keepdims=True)
        exact = float(np.sum(gradient_of * direction))
        worst = max(worst, abs(exact - central_difference(of, array, direction)) / max(1.0, abs(exact)))
report.measure("exact_gradient_vs_finite_differences", worst, 1e-6)
report.measure("exact_gradient_cost_is_plan", np.abs(d_cost - numpy(weights)[:, None, None] * plans).max(), 1e-12)

if BACKEND == "jax":
    import jax

    # The exact method inside jax.jit (a host callback): the same values and Danskin gradients as eagerly.
    step = jax.jit(jax.value_and_grad(exact_loss, argnums=(0, 1, 2)))
    value, grads = step(tensor(cost), tensor(a), tensor(b))
    report.measure("jit_exact_value_vs_eager", abs(float(value) - float(numpy(exact_loss(tensor(cost), tensor(a),
                                                                                          tensor(b))))), 1e-12)
    report.measure("jit_exact_gradient_vs_eager", max(np.abs(np.asarray(g) - e).max()
                                                      for g, e in zip(grads, (d_cost, d_a, d_b))), 1e-12)
    jitted = jax.jit(lambda c: emd(c, method="exact"))(tensor(cost))
    reference = np.stack([ot.emd(np.full(5, 0.2), np.full(4, 0.25), cost[k]) for k in range(3)])
    report.measure("jit_exact_plan_vs_pot", np.abs(np.asarray(jitted.plan) - reference).max(), 1e-9)
    report.expect("jit_exact_converged", bool(np.all(np.asarray(jitted.converged)))
                  and bool(np.all(np.asarray(jitted.iterations) == -1)))
elif BACKEND == "tensorflow":
    import tensorflow as tf

    traced = tf.function(lambda c, a_, b_: emd(c, a_, b_, method="exact").cost)(cost, a, b)
    report.measure("graph_exact_cost_vs_eager", np.abs(traced.numpy() - numpy(result.cost)).max(), 1e-12)

# The entropic method against POT's Sinkhorn (log domain, float64, run to a tight tolerance).
reference = np.stack([ot.sinkhorn(a[k], b[k], cost[k], 0.1, method="sinkhorn_log", stopThr=1e-14,
                                  numItermax=100000) for k in range(3)])
for domain in ("log", "kernel"):
    entropic = emd(tensor(cost), tensor(a), tensor(b), method="sinkhorn", epsilon=0.1, max_iter=5000,
                   threshold=1e-10, domain=domain)
    report.measure(f"sinkhorn_plan_vs_pot_{domain}", np.abs(numpy(entropic.plan) - reference).max(), 1e-8)
    report.measure(f"sinkhorn_cost_vs_pot_{domain}",
                   np.abs(numpy(entropic.cost) - (reference * cost).sum((-2, -1))).max(), 1e-8)
    report.expect(f"sinkhorn_counts_{domain}", bool(numpy(entropic.converged).all())
                  and bool(np.all((numpy(entropic.iterations) > 0) & (numpy(entropic.iterations) < 5000)))
                  and bool(np.all(numpy(entropic.error) <= 1e-10)))


# EMDHead against NumPy: scale * sum_ij (1 - c_ij) T_ij with the channel-centred cosine cost and the
# cross-reference weights (Zhang et al. 2022, Eq. 1-2, 11-12).
def features(*shape):
    return np.maximum(rng.standard_normal(shape), 0) + 0.01 * rng.random(shape)


def reference_logits(query, support, method, node_weights, scale=12.5, epsilon=0.03):
    q = query.reshape(query.shape[0], -1, query.shape[-1])
    s = support.reshape(support.shape[0], -1, support.shape[-1])
    unit = lambda v: v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)  # noqa: E731
    logits = np.zeros((len(q), len(s)))
    for i, u in enumerate(q):
        for k, v in enumerate(s):
            c = np.maximum(1 - unit(u - u.mean(1, keepdims=True)) @ unit(v - v.mean(1, keepdims=True)).T, 0)
            if node_weights == "uniform":
                w_a, w_b = np.full(len(u), 1.0 / len(u)), np.full(len(v), 1.0 / len(v))
            else:
                w_a = np.maximum(u @ v.mean(0), 0) + 1e-3
                w_b = np.maximum(v @ u.mean(0), 0) + 1e-3
                w_a, w_b = w_a / w_a.sum(), w_b / w_b.sum()
            if method == "exact":
                plan = ot.emd(w_a, w_b, c)
            else:
                plan = ot.sinkhorn(w_a, w_b, c, epsilon, method="sinkhorn_log", stopThr=1e-13, numItermax=100000)
            logits[i, k] = scale * np.sum((1 - c) * plan)
    return logits


query, support = features(3, 2, 2, 6), features(2, 4, 6)
for method in ("exact", "sinkhorn"):
    for node_weights in ("cross_reference", "uniform"):
        # (epsilon = 0.1: Sinkhorn converges to 1e-11 in a few hundred updates)
        settings = dict(epsilon=0.1, max_iter=20000, threshold=1e-11) if method == "sinkhorn" else {}
        head = EMDHead(method=method, node_weights=node_weights, dtype="float64", **settings)
        logits = numpy(head([tensor(query), tensor(support)]))
        expected = reference_logits(query, support, method, node_weights, epsilon=0.1)
        report.measure(f"head_{method}_{node_weights}_vs_numpy", np.abs(logits - expected).max(), 1e-7)
    # float32 (the default policy): close to the float64 formula, finite gradients for query and support.
    query32, support32 = query.astype(np.float32), support.astype(np.float32)
    head = EMDHead(method=method)
    logits = numpy(head([tensor(query32), tensor(support32)]))
    report.expect(f"head_{method}_float32_dtype", logits.dtype == np.float32)
    tolerance = 5e-5 if method == "exact" else 0.03 * 12.5  # the default epsilon: within ~2 % of the EMD
    report.measure(f"head_{method}_float32_vs_numpy_exact",
                   np.abs(logits - reference_logits(query, support, "exact", "cross_reference")).max(), tolerance)
    labels = tensor(np.array([0, 1, 0]))
    _, grads = value_and_grad(
        lambda q, s: ops.sum(keras.losses.sparse_categorical_crossentropy(labels, head([q, s]), from_logits=True)),
        query32, support32)
    report.expect(f"head_{method}_gradients_finite", all(np.all(np.isfinite(g)) for g in grads))
    report.expect(f"head_{method}_gradients_nonzero", all(np.abs(g).max() > 0 for g in grads))

# PatchExtractor: grid cells of the cell size are the image cells; random crops stay within the image's range.
images = rng.random((2, 8, 8, 1)).astype(np.float32)
cells = numpy(PatchExtractor("grid", grid=2, patch_size=4)(tensor(images)))
report.measure("grid_cells_vs_numpy", np.abs(cells[1, 2] - images[1, 4:, :4]).max(), 1e-6)
crops = PatchExtractor("sampling", num_patches=5, patch_size=6, seed=1)
first, second = numpy(crops(tensor(images))), numpy(crops(tensor(images)))
report.expect("sampled_crops_shape", first.shape == (2, 5, 6, 6, 1))
report.expect("sampled_crops_fresh", not np.allclose(first, second))
report.expect("sampled_crops_in_range", first.min() >= images.min() - 1e-6 and first.max() <= images.max() + 1e-6)

# A tiny model with EMDHead(method="sinkhorn") (inside StructuredFC): fit lowers the loss in one epoch, the .keras
# file round-trips; an exact StructuredFC predicts as it computes eagerly (compiled by Keras on JAX).
centres = rng.normal(size=(3, 4, 6))
y = rng.integers(0, 3, 64)
x = (centres[y] + 0.8 * rng.normal(size=(64, 4, 6))).astype(np.float32)


def sfc_model(method):
    inputs = keras.Input((4, 6))
    outputs = StructuredFC(3, 4, head={"method": method}, name="sfc")(keras.layers.Dense(6)(inputs))
    return keras.Model(inputs, outputs)


keras.utils.set_random_seed(0)
model = sfc_model("sinkhorn")
loaded = fit_and_round_trip(report, model, x, y, epochs=1)
report.expect("keras_round_trip_head_config", loaded.get_layer("sfc").head.method == "sinkhorn")

exact_model = sfc_model("exact")
exact_model.set_weights(model.get_weights())
predicted = exact_model.predict(x[:8], verbose=0)
eager = numpy(exact_model(tensor(x[:8])))
report.measure("exact_logits_scale", np.abs(eager).max())
# float32 logits of a few units, computed compiled and eagerly: their difference is judged against their scale
report.measure("exact_predict_vs_eager_relative", np.abs(predicted - eager).max() / np.abs(eager).max(), 1e-5)

# Fine-tuning a structured FC on a support set (Keras' fit on JAX and PyTorch, a tf.function on TensorFlow; it
# failed on JAX and PyTorch): two steps of SGD with momentum 0.9 from the class means, on the mini-batches its seed
# draws, equal the velocity-form updates computed here from this backend's gradients of the support loss.
from training.evaluation.structured_fc import fine_tune_structured_fc  # noqa: E402

support_labels = np.repeat(np.arange(3), 3)
support = (centres[support_labels] + 0.8 * rng.normal(size=(9, 4, 6))).astype(np.float32)
# float64: compiled (fit) and eager (the reference) float32 solves at epsilon 0.03 differ by ~1e-4 relative
layer = StructuredFC(3, 4, head={"method": "sinkhorn"}, dtype="float64")
fine_tune_structured_fc(layer, support, support_labels, steps=2, batch_size=4, learning_rate=0.05, momentum=0.9,
                        seed=3)
tuned = numpy(layer.nodes)
# again, on the same support set: the compiled fine-tuning is reused, its velocity starts at zero again
fine_tune_structured_fc(layer, support, support_labels, steps=2, batch_size=4, learning_rate=0.05, momentum=0.9,
                        seed=3)
report.measure("structured_fc_fine_tuning_repeats", np.abs(numpy(layer.nodes) - tuned).max(), 1e-12)
if BACKEND == "tensorflow":  # TensorFlow draws its mini-batches with its own stateless generator
    import tensorflow as tf

    batches = tf.random.stateless_uniform([2, 4], [3, 0], maxval=9, dtype=tf.int32).numpy()
else:
    batches = np.random.default_rng(3).integers(0, 9, size=8).reshape(2, 4)


def support_loss(nodes, batch):
    logits = layer.head([tensor(support[batch].astype(np.float64)), nodes])
    return ops.mean(keras.losses.sparse_categorical_crossentropy(tensor(support_labels[batch]), logits,
                                                                 from_logits=True))


nodes = np.stack([support[support_labels == k].mean(0) for k in range(3)]).astype(np.float64)
velocity = np.zeros_like(nodes)
for batch in batches:
    velocity = 0.9 * velocity + value_and_grad(lambda n: support_loss(n, batch), nodes)[1][0]
    nodes = nodes - 0.05 * velocity
if BACKEND != "tensorflow":  # the TensorFlow loop refuses another backend's head in one line naming the way
    from training.evaluation.structured_fc import fine_tune_nodes  # noqa: E402

    try:
        fine_tune_nodes(layer.head, support, support_labels, nodes)
        refusal = ""
    except ValueError as error:
        refusal = str(error)
    report.expect("fine_tune_nodes_names_fine_tune_structured_fc", "fine_tune_structured_fc" in refusal, refusal)
report.measure("structured_fc_fine_tuning_vs_momentum_steps", np.abs(tuned - nodes).max() / np.abs(nodes).max(), 1e-7)

report.finish()
