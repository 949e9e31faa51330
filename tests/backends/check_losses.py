"""The metric-learning losses, the zero-shot loss, the random-walk similarity and ``ManifoldProxies``' random-walk
modes on the active Keras backend, against NumPy implementations of their documented formulas, central finite
differences (float64) and a compiled run.

    KERAS_BACKEND=jax python tests/backends/check_losses.py

Float32 values are compared relative to ``max(1, |reference|)`` (within 1e-5), float64 values (the losses built with
``dtype="float64"``, which then compute in float64) within 1e-10, gradients along random directions within 1e-6 of
``max(1, |exact|)``.
"""
import numpy as np
import scipy.linalg
from keras import ops

from backend_tools import (Report, central_difference, compiled_value_and_grad, jitted, numpy, tensor,
                           value_and_grad)
from ot_layers import ManifoldProxies
from ot_layers.losses import (ContrastiveLoss, HypersphericalPullLoss, ManifoldProxyLoss, MultiSimilarityLoss,
                              ProxyAnchorLoss, ProxyNCAPlusPlusLoss, TripletLoss, ZeroShotPredictionLoss)
from ot_layers.losses.common import replicas_in_sync
from ot_layers.solvers import random_walk_similarity

report = Report("losses")
rng = np.random.default_rng(0)


# NumPy references, in float64, written from the docstrings' formulas.
def unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-6)


def pair_masks(labels):
    same = labels[:, None] == labels[None, :]
    return same & ~np.eye(len(labels), dtype=bool), ~same


def distances(x):
    squared = (x * x).sum(-1)[:, None] + (x * x).sum(-1)[None, :] - 2.0 * x @ x.T
    return np.sqrt(np.maximum(squared, 1e-12))


def masked_mean(values, mask):
    return values[mask].sum() / max(mask.sum(), 1)


def relu(x):
    return np.maximum(x, 0.0)


def ref_contrastive(labels, x, normalize=True, pos_margin=0.2652, neg_margin=0.5409):
    d = distances(unit(x) if normalize else x)
    positive, negative = pair_masks(labels)
    return masked_mean(relu(d - pos_margin), positive) + masked_mean(relu(neg_margin - d), negative)


def ref_triplet(labels, x, margin=0.1):
    d = distances(unit(x))
    positive, negative = pair_masks(labels)
    losses = relu(d[:, :, None] - d[:, None, :] + margin)
    valid = positive[:, :, None] & negative[:, None, :]
    return masked_mean(losses, valid & (losses > 0))


def log1p_sum_exp(values):
    return np.log1p(np.exp(values).sum()) if len(values) else 0.0


def ref_multi_similarity(labels, x, alpha=2.0, beta=50.0, base=0.5, mining_margin=0.1):
    s = unit(x) @ unit(x).T
    positive, negative = pair_masks(labels)
    total = 0.0
    for i in range(len(labels)):
        hardest_negative = s[i, negative[i]].max() if negative[i].any() else -np.inf
        hardest_positive = s[i, positive[i]].min() if positive[i].any() else np.inf
        kept_positive = positive[i] & (s[i] - mining_margin < hardest_negative)
        kept_negative = negative[i] & (s[i] + mining_margin > hardest_positive)
        total += (log1p_sum_exp(-alpha * (s[i, kept_positive] - base)) / alpha
                  + log1p_sum_exp(beta * (s[i, kept_negative] - base)) / beta)
    return total / len(labels)


def cross_entropy(labels, logits):
    shift = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - shift).sum(-1)) + shift[:, 0]
    return lse - logits[np.arange(len(labels)), labels]


def ref_proxy_nca(labels, similarity, temperature=0.1):
    logits = -(2.0 - 2.0 * similarity.max(-1)) / temperature
    return cross_entropy(labels, logits).mean()


def ref_proxy_anchor(labels, similarity, margin=0.1, alpha=32.0):
    num_classes, per_class = similarity.shape[1:]
    s = similarity.reshape(len(labels), -1)
    proxy_labels = np.repeat(np.arange(num_classes), per_class)
    positive = labels[:, None] == proxy_labels[None, :]
    with_positive = [p for p in range(s.shape[1]) if positive[:, p].any()]
    pos = sum(log1p_sum_exp(-alpha * (s[positive[:, p], p] - margin)) for p in with_positive) / len(with_positive)
    neg = np.mean([log1p_sum_exp(alpha * (s[~positive[:, p], p] + margin)) for p in range(s.shape[1])])
    return pos + neg


def ref_zero_shot(labels, packed, ridge=0.05, scale=9.5):
    z, upsilon = packed[:, 0], packed[0, 1:]
    targets = upsilon[labels]
    first = labels < np.sort(labels)[len(labels) // 2]
    total = 0.0
    for fit_on, evaluate_on in ((first, ~first), (~first, first)):
        z_b, v_b = z[fit_on], targets[fit_on]
        predictor = v_b.T @ scipy.linalg.solve(z_b @ z_b.T + ridge * np.eye(len(z_b)), z_b)  # A of (P3)
        logits = scale * (z @ predictor.T) @ upsilon.T
        total += cross_entropy(labels, logits)[evaluate_on].mean()
    return total


def ref_random_walk(points, alpha=0.8, temperature=0.5):
    x = unit(np.asarray(points, np.float64))
    affinity = np.exp(x @ np.swapaxes(x, -1, -2) / temperature)
    n = x.shape[-2]
    affinity = affinity * (1.0 - np.eye(n))
    inv_sqrt_degree = 1.0 / np.sqrt(affinity.sum(-1))
    normalized = affinity * inv_sqrt_degree[..., :, None] * inv_sqrt_degree[..., None, :]
    flat = normalized.reshape(-1, n, n)
    out = [(1.0 - alpha) * scipy.linalg.solve(np.eye(n) - alpha * s, np.eye(n), assume_a="pos") for s in flat]
    return np.stack(out).reshape(normalized.shape)


# Inputs: 4 classes twice and a fifth class once (a sample without positives), proxies for 6 classes (one without
# positives in the batch).
labels = np.array([0, 2, 1, 0, 3, 2, 1, 3, 4])
embeddings = rng.normal(size=(len(labels), 6))
similarities = np.tanh(rng.normal(size=(len(labels), 6, 2)))
zs_labels = np.array([0, 2, 1, 0, 3, 2, 1, 3])
packed = rng.normal(size=(len(zs_labels), 1 + 4, 5)) * 0.5
packed[:, 1:] = packed[0, 1:]  # the packed ClassProxies output: every row holds the same class embeddings

CASES = [  # name, loss class, keyword arguments, labels, y_pred, NumPy reference
    ("contrastive", ContrastiveLoss, {}, labels, embeddings, ref_contrastive),
    ("contrastive_unnormalized", ContrastiveLoss, {"normalize": False}, labels, embeddings * 0.3,
     lambda y, x: ref_contrastive(y, x, normalize=False)),
    ("triplet", TripletLoss, {"margin": 0.5}, labels, embeddings, lambda y, x: ref_triplet(y, x, margin=0.5)),
    ("multi_similarity", MultiSimilarityLoss, {}, labels, embeddings, ref_multi_similarity),
    ("proxy_nca_pp", ProxyNCAPlusPlusLoss, {}, labels, similarities, ref_proxy_nca),
    ("proxy_anchor", ProxyAnchorLoss, {}, labels, similarities, ref_proxy_anchor),
    ("zero_shot", ZeroShotPredictionLoss, {}, zs_labels, packed, ref_zero_shot),
]

for name, loss_class, kwargs, y, x, reference in CASES:
    expected = reference(y, x)
    report.measure(f"{name}_reference", expected)
    # float32 (the default: Keras casts y_pred to the loss' float32 dtype)
    got = float(numpy(loss_class(**kwargs)(tensor(y), tensor(x.astype(np.float32)))))
    report.measure(f"{name}_float32_vs_numpy", abs(got - expected) / max(1.0, abs(expected)), 1e-5)
    # float64: value, gradient against central differences, compiled against eager
    loss64 = loss_class(dtype="float64", **kwargs)

    def of(prediction, loss64=loss64, y=y):
        return loss64(tensor(y), prediction)

    value, (gradient,) = value_and_grad(of, x)
    report.measure(f"{name}_float64_vs_numpy", abs(value - expected), 1e-10)
    report.expect(f"{name}_gradient_finite", np.all(np.isfinite(gradient)))
    worst = 0.0
    for _ in range(2):
        direction = rng.normal(size=x.shape)
        exact = float(np.sum(gradient * direction))
        worst = max(worst, abs(exact - central_difference(of, x, direction)) / max(1.0, abs(exact)))
    report.measure(f"{name}_gradient_vs_finite_differences", worst, 1e-6)
    compiled = compiled_value_and_grad(of, x)
    if compiled is not None:
        report.measure(f"{name}_compiled_vs_eager", max(abs(compiled[0] - value),
                                                        np.abs(compiled[1][0] - gradient).max()), 1e-9)

report.expect("one_replica_outside_a_strategy", replicas_in_sync() == 1)

# An empty batch (a replica's share of a last, short batch) has loss 0 with a zero gradient; labels that are
# one-hot, or not one per row, fail with a ValueError naming `y_true` (before: a broadcast error deep in the loss).
for name, loss_class, kwargs, y, x, reference in CASES:
    value, (gradient,) = value_and_grad(lambda p, c=loss_class, k=kwargs, y=y: c(dtype="float64", **k)(
        tensor(y[:0]), p), x[:0])
    report.expect(f"{name}_empty_batch_zero", value == 0.0 and gradient.shape == x[:0].shape, f"{value}")
    for bad_name, bad in (("one_hot", np.eye(y.max() + 1)[y]), ("short", y[:-1])):
        try:
            loss_class(**kwargs)(tensor(bad), tensor(x.astype(np.float32)))
            message = "no error"
        except ValueError as error:
            message = str(error)
        report.expect(f"{name}_{bad_name}_labels_named", message.startswith("`y_true` of"), message[:120])

# Non-finite embeddings give a non-finite multi-similarity loss, eagerly and compiled (NaN similarities failed every
# mining comparison and dropped out: all-NaN embeddings gave 0, a NaN row a finite loss).
multi_similarity = MultiSimilarityLoss()
compiled_multi_similarity = jitted(lambda y, x: multi_similarity(y, x))
nan_row = embeddings.copy()
nan_row[3] = np.nan
for name, bad in (("all_nan", np.full_like(embeddings, np.nan)), ("nan_row", nan_row)):
    for run, loss in (("eager", multi_similarity), ("compiled", compiled_multi_similarity)):
        value = float(numpy(loss(tensor(labels), tensor(bad.astype(np.float32)))))
        report.expect(f"multi_similarity_{name}_{run}_not_finite", not np.isfinite(value), f"{value}")

# A label outside 0..C-1 (-1, or C) contributes zero to ProxyNCA++ and the zero-shot loss, as to the manifold and
# pull losses: ProxyNCA++ is the batch mean with a zero term for it, the zero-shot loss that of the batch without
# it; its row gets a zero gradient (TensorFlow's CPU raised, a GPU gather gave zeros or NaN).
OUTSIDE_CASES = [  # name, loss class, labels with two outside the classes, y_pred, reference
    ("proxy_nca_pp", ProxyNCAPlusPlusLoss, np.where(np.arange(len(labels)) == 1, -1,
                                                    np.where(np.arange(len(labels)) == 4, 6, labels)), similarities,
     lambda y, x, known: ref_proxy_nca(y[known], x[known]) * known.sum() / len(y)),
    ("zero_shot", ZeroShotPredictionLoss, np.where(np.arange(len(zs_labels)) == 2, -1,
                                                   np.where(np.arange(len(zs_labels)) == 5, 4, zs_labels)), packed,
     lambda y, x, known: ref_zero_shot(y[known], x[known])),
]
for name, loss_class, y, x, reference in OUTSIDE_CASES:
    known = (y >= 0) & (y < x.shape[1] - (name == "zero_shot"))
    expected = reference(y, x, known)
    loss64 = loss_class(dtype="float64")

    def of(prediction, loss64=loss64, y=y):
        return loss64(tensor(y), prediction)

    for run, result in (("eager", value_and_grad(of, x)), ("compiled", compiled_value_and_grad(of, x))):
        if result is None:
            continue
        value, (gradient,) = result
        report.measure(f"{name}_label_outside_{run}_vs_numpy", abs(value - expected), 1e-10)
        report.expect(f"{name}_label_outside_{run}_gradient",
                      np.all(np.isfinite(gradient)) and np.all(gradient[~known, 0] == 0)
                      and np.any(gradient[known] != 0))

# y_pred of the wrong rank, or with too few classes, fails with a ValueError naming `y_pred` (before: a SelectV2
# broadcast error, an IndexError, or a loss over one class that is always 0).
BAD_PREDICTIONS = [
    (MultiSimilarityLoss, (9, 6, 2)), (ProxyNCAPlusPlusLoss, (9, 6)), (ProxyNCAPlusPlusLoss, (9, 1, 2)),
    (ZeroShotPredictionLoss, (9, 5)), (ZeroShotPredictionLoss, (9, 2, 5)), (HypersphericalPullLoss, (9, 6, 2)),
    (HypersphericalPullLoss, (9,)), (ManifoldProxyLoss, (9, 6, 2)), (ManifoldProxyLoss, (9,)),
]
for loss_class, shape in BAD_PREDICTIONS:
    try:
        loss_class()(tensor(labels), tensor(np.zeros(shape, np.float32)))
        message = "no error"
    except ValueError as error:
        message = str(error)
    report.expect(f"{loss_class.__name__}_y_pred_{'x'.join(map(str, shape))}_named",
                  message.startswith(f"`y_pred` of {loss_class.__name__} must be"), message[:120])

# The random-walk similarity (eq. 9) against a scipy solve, batched; a non-finite point is cut out of the graph.
points = rng.normal(size=(2, 7, 4)).astype(np.float32)
walk = numpy(random_walk_similarity(tensor(points)))
report.expect("random_walk_float32", walk.dtype == np.float32)
report.measure("random_walk_vs_scipy", np.abs(walk - ref_random_walk(points)).max(), 1e-5)
report.measure("random_walk_symmetric", np.abs(walk - np.swapaxes(walk, -1, -2)).max(), 1e-5)
poisoned = points[0].copy()
poisoned[3, 1] = np.nan
walk_poisoned = numpy(random_walk_similarity(tensor(poisoned)))
kept = [0, 1, 2, 4, 5, 6]
report.expect("random_walk_nan_row_only_for_the_bad_point",
              np.all(np.isnan(walk_poisoned[3])) and np.all(np.isfinite(walk_poisoned[np.ix_(kept, kept)])))
report.measure("random_walk_bad_point_cut_out", np.abs(walk_poisoned[np.ix_(kept, kept)]
                                                       - ref_random_walk(points[0, kept])).max(), 1e-5)

# ManifoldProxies' random-walk modes: outputs equal eq. 10-12 on the NumPy walk, finite, with finite gradients.
batch, num_classes, dim = 8, 3, 6
inputs = rng.normal(size=(batch, dim)).astype(np.float32)
weights = tensor(rng.normal(size=(batch, num_classes)).astype(np.float32))
for mode in ("contextual", "intrinsic"):
    layer = ManifoldProxies(num_classes, dim, mode=mode)
    out = numpy(layer(tensor(inputs)))
    walk = ref_random_walk(np.concatenate([inputs, numpy(layer.proxies)]))[:, batch:]
    expected = walk[:batch] if mode == "intrinsic" else walk[:batch] @ walk[batch:].T
    report.expect(f"manifold_proxies_{mode}_finite", np.all(np.isfinite(out)))
    report.measure(f"manifold_proxies_{mode}_vs_numpy", np.abs(out - expected).max(), 1e-5)
    _, (gradient,) = value_and_grad(lambda t, layer=layer: ops.sum(layer(t) * weights), inputs)
    report.expect(f"manifold_proxies_{mode}_gradient_finite",
                  np.all(np.isfinite(gradient)) and np.abs(gradient).max() > 0)
    compiled = compiled_value_and_grad(lambda t, layer=layer: ops.sum(layer(t) * weights), inputs)
    if compiled is not None:
        report.measure(f"manifold_proxies_{mode}_compiled_gradient_vs_eager",
                       np.abs(compiled[1][0] - gradient).max(), 1e-5)

# A batch-level loss refuses per-sample weights (Keras scales its one value by their mean: it took them silently)
try:
    ContrastiveLoss()(tensor(np.array([0, 0, 1, 1])), tensor(np.eye(4, 3, dtype=np.float32)),
                      sample_weight=tensor(np.ones(4, np.float32)))
    refusal = ""
except ValueError as error:
    refusal = str(error)
report.expect("batch_loss_refuses_sample_weight", refusal.startswith("`sample_weight`: ContrastiveLoss"), refusal)

report.finish()
