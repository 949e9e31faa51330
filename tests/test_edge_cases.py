"""Every public layer and solver through the same edge cases.

One table (``CASES``) holds a row per layer / solver configuration: how to build it, how to make its inputs from a
feature tensor (a batch of feature maps ``(B, H, W, d)`` or of vectors ``(B, d)``), and its documented behaviour on
NaN input ("confined": the other samples' outputs and input gradients equal a run on the batch without the bad
sample; or the error a host-side check raises). The tests below run the same edge case over every row:

- all-zero feature vectors (a whole sample, and some cells of another sample): finite outputs, and finite gradients
  of a random linear functional of the outputs with respect to the inputs and the trainable weights;
- NaN in one sample: confined (against a run without that sample, 1e-5 of the outputs' scale) or the documented
  error (``ValueError`` eagerly, ``tf.errors.InvalidArgumentError`` from inside a graph);
- mixed precision (layers): the output in the compute dtype, finite, within 1e-2 of the float32 run's scale;
- unknown spatial size (layers taking feature maps): a model on ``keras.Input((None, None, d))`` equals the layer
  called on fixed-size inputs, for two spatial sizes;
- ``epsilon = 1e-3`` in float32 (everything with an ``epsilon``): finite outputs and gradients, layers against
  their own float64 run, solvers against POT's exact (partial) EMD in float64 within the entropic bias
  ``epsilon * log(n m)`` plus the stopping tolerance;

and, where they apply: zero-mass marginals (``sinkhorn`` and ``emd``, both methods, against POT on the reduced
problem), cost exponents ``p`` in {0.5, 1, 2} (``SinkhornMatch``, ``MultiProxyWasserstein``: finite at a zero cost,
autodiff against central finite differences away from it, float64), and ``estimate_prototypes`` at its smallest
sizes (closed-form optima) and bad arguments.
"""
import dataclasses
import inspect
import itertools
import math
from typing import Callable, Optional

import keras
import numpy as np
import ot
import pytest
import tensorflow as tf

import ot_layers
from ot_layers import (ClassProxies, EMDHead, GeneralizedSumPooling, HypersphericalPrototypes, ManifoldProxies,
                       MultiProxyWasserstein, PatchExtractor, SinkhornMatch, StructuredFC, solvers)
from ot_layers.layers.sinkhorn_match import pairwise_cost
from ot_layers.solvers.emd import SINKHORN_EPSILON
from ot_layers.solvers.prototypes import max_pairwise_cosine
from ot_layers.tensor_ops import flatten_feature_map, normalize_rows
from tests.gradient_checks import assert_directional_derivatives

B, D, K = 3, 4, 3  # batch, feature dimension, classes
MAP = (3, 3)  # spatial size of the feature maps


def _constant(seed, shape):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


TARGETS = _constant(101, (K, 2, D))      # SinkhornMatch: a target set per class
SUPPORT = _constant(102, (K, 2, 2, D))   # EMDHead: a support feature map per class
TARGET_VECTORS = _constant(103, (3, D))  # solvers: the columns of every transport problem, hungarian's rows


def _like(array, x):
    """A constant side input in the dtype of ``x`` (a tensor, KerasTensor or array)."""
    return np.asarray(array, dtype=keras.backend.standardize_dtype(x.dtype))


def _cosine_cost(x):
    """``1 - cos`` between the elements of feature maps ``(B, H, W, d)`` and ``TARGET_VECTORS``: ``(B, H*W, 3)``.
    A zero element has cosine 0 with everything (cost 1)."""
    x = tf.convert_to_tensor(x)
    flat = normalize_rows(flatten_feature_map(x))
    return 1.0 - tf.einsum("bnd,md->bnm", flat, normalize_rows(tf.constant(_like(TARGET_VECTORS, x))))


# --- the table -------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    """One layer or solver configuration.

    build(**overrides): the layer (``layer=True``) or the solver's keyword arguments.
    apply(built, x): the output tensor(s) for the feature tensor ``x``.
    kind: ``"map"`` (``x`` is ``(B, H, W, d)``) or ``"vector"`` (``(B, d)``).
    nan: ``"confined"`` or the error type raised eagerly, its message naming the argument ``nan_match``;
      ``graph_nan`` the error raised inside a ``tf.function``.
    mixed_dtype: the output dtype under ``mixed_float16`` (layers).
    epsilon: the settings for ``epsilon = 1e-3`` (``None``: the case has no ``epsilon``).
    pairs: outputs are indexed by pairs of samples (both leading axes are batch axes).
    random: fresh random draws on every call (PatchExtractor's sampling mode).
    nan_index: the sample made NaN; check: extra checks of a host solver's outputs ``check(x, outputs)``.
    """

    name: str
    target: object
    build: Callable
    apply: Callable
    kind: str = "map"
    layer: bool = True
    differentiable: bool = True
    nan: object = "confined"
    graph_nan: object = None
    nan_match: Optional[str] = None
    mixed_dtype: str = "float16"
    epsilon: Optional[dict] = None
    spatial: tuple = MAP
    sizes: tuple = ((2, 3), (3, 2))
    pairs: bool = False
    random: bool = False
    nan_index: int = 1
    check: Optional[Callable] = None


def _greedy_check(x, outputs):
    """Farthest-point traversal: distinct indices, each the farthest point from those chosen before it."""
    points = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    (chosen,) = outputs
    assert len(set(chosen.tolist())) == len(chosen) == 4 and chosen.min() >= 0 and chosen.max() < len(points)
    for i in range(1, len(chosen)):
        distance = np.min(((points[:, None, :] - points[None, chosen[:i], :]) ** 2).sum(-1), axis=1)
        assert distance[chosen[i]] == pytest.approx(distance.max(), abs=1e-12)


def _hungarian_check(x, outputs):
    """The assignment is a bijection and as good as the best of every permutation (brute force)."""
    similarity = TARGET_VECTORS.astype(np.float64) @ np.asarray(x, np.float64).T
    (sigma,) = outputs
    assert len(sigma) == similarity.shape[0] and len(set(sigma.tolist())) == len(sigma)
    assert sigma.min() >= 0 and sigma.max() < similarity.shape[1]
    best = max(sum(similarity[k, s[k]] for k in range(len(s)))
               for s in itertools.permutations(range(similarity.shape[1]), similarity.shape[0]))
    assert sum(similarity[k, sigma[k]] for k in range(len(sigma))) == pytest.approx(best, abs=1e-12)


LAYER_CASES = [
    Case("SinkhornMatch", SinkhornMatch,
         lambda **kw: SinkhornMatch(return_cost=True, **kw),
         lambda layer, x: layer([x, _like(TARGETS, x)]),
         epsilon=dict(epsilon=1e-3, max_iter=10_000, threshold=1e-3)),
    Case("MultiProxyWasserstein", MultiProxyWasserstein,
         lambda **kw: MultiProxyWasserstein(K, num_proxies=2, **kw),
         lambda layer, x: layer(x),
         epsilon=dict(epsilon=1e-3, max_iter=10_000, threshold=1e-3)),
    Case("ClassProxies-similarities", ClassProxies,
         lambda **kw: ClassProxies(K, num_proxies=2, **kw),
         lambda layer, x: layer(x),
         kind="vector", mixed_dtype="float32"),  # documented: float32 outputs, like a final softmax
    Case("ClassProxies-packed", ClassProxies,
         lambda **kw: ClassProxies(K, num_proxies=1, dim=6, output="packed", **kw),
         lambda layer, x: layer(x),
         kind="vector", mixed_dtype="float32"),
    Case("GeneralizedSumPooling", GeneralizedSumPooling,
         lambda **kw: GeneralizedSumPooling(num_prototypes=4, return_attributes=True, **kw),
         lambda layer, x: layer(x),
         epsilon=dict(epsilon=1e-3, max_iter=1000)),
    Case("EMDHead-sinkhorn", EMDHead,
         lambda **kw: EMDHead(method="sinkhorn", **kw),
         lambda layer, x: layer([x, _like(SUPPORT, x)]),
         epsilon=dict(epsilon=1e-3, max_iter=10_000, threshold=1e-3)),
    Case("EMDHead-exact", EMDHead,
         lambda **kw: EMDHead(method="exact", **kw),
         lambda layer, x: layer([x, _like(SUPPORT, x)]),
         nan=ValueError, graph_nan=tf.errors.InvalidArgumentError, nan_match="`cost`.*finite"),
    Case("StructuredFC-sinkhorn", StructuredFC,
         lambda dtype=None, **kw: StructuredFC(K, num_nodes=4, head=dict(method="sinkhorn", **kw), dtype=dtype),
         lambda layer, x: layer(x),
         epsilon=dict(epsilon=1e-3, max_iter=10_000, threshold=1e-3)),
    Case("StructuredFC-exact", StructuredFC,
         lambda **kw: StructuredFC(K, num_nodes=4, head=dict(method="exact"), **kw),
         lambda layer, x: layer(x),
         nan=ValueError, graph_nan=tf.errors.InvalidArgumentError, nan_match="`cost`.*finite"),
    Case("PatchExtractor-grid", PatchExtractor,
         lambda **kw: PatchExtractor("grid", grid=2, patch_size=2, **kw),
         lambda layer, x: layer(x),
         spatial=(4, 4), sizes=((4, 4), (2, 6))),
    # Crops are drawn per position in the batch: the NaN sample is the last one, so that the others keep theirs.
    Case("PatchExtractor-sampling", PatchExtractor,
         lambda **kw: PatchExtractor("sampling", num_patches=2, patch_size=2, seed=1, **kw),
         lambda layer, x: layer(x),
         spatial=(4, 4), sizes=((4, 4), (2, 6)), random=True, nan_index=B - 1),
    Case("HypersphericalPrototypes", HypersphericalPrototypes,
         lambda **kw: HypersphericalPrototypes(K, D, **kw),
         lambda layer, x: layer(x),
         kind="vector"),
] + [
    Case(f"ManifoldProxies-{mode}", ManifoldProxies,
         lambda mode=mode, **kw: ManifoldProxies(K, D, mode=mode, **kw),
         lambda layer, x: layer(x),
         kind="vector")  # contextual / intrinsic: batch-coupled, the contract still holds (bad samples cut out)
    for mode in ("direct", "contextual", "intrinsic")
]

SOLVER_CASES = [
    Case("sinkhorn", solvers.sinkhorn,
         lambda **kw: kw,
         lambda kw, x: (lambda r: (r.plan, r.value, r.transport_cost))(solvers.sinkhorn(_cosine_cost(x), **kw)),
         layer=False, epsilon=dict(epsilon=1e-3, max_iter=10_000, threshold=1e-4)),
    Case("partial_transport", solvers.partial_transport,
         lambda **kw: kw,
         lambda kw, x: tuple(solvers.partial_transport(tf.transpose(_cosine_cost(x), [0, 2, 1]), 0.3, **kw)[:2]),
         layer=False, epsilon=dict(epsilon=1e-3, max_iter=1000, threshold=1e-6)),
    Case("emd-exact", solvers.emd,
         lambda **kw: kw,
         lambda kw, x: tuple(solvers.emd(_cosine_cost(x), method="exact", **kw)[:2]),
         layer=False, nan=ValueError, graph_nan=tf.errors.InvalidArgumentError,
         nan_match="`cost`.*finite"),
    Case("emd-sinkhorn", solvers.emd,
         lambda **kw: kw,
         lambda kw, x: tuple(solvers.emd(_cosine_cost(x), method="sinkhorn", **kw)[:2]),
         layer=False, epsilon=dict(epsilon=1e-3, max_iter=10_000, threshold=1e-4)),
    Case("random_walk_similarity", solvers.random_walk_similarity,
         lambda **kw: kw,
         lambda kw, x: solvers.random_walk_similarity(x, **kw),
         kind="vector", layer=False, pairs=True),
    Case("greedy_k_center", solvers.greedy_k_center,
         lambda **kw: kw,
         lambda kw, x: solvers.greedy_k_center(np.asarray(x).reshape(-1, D), 4, **kw),
         layer=False, differentiable=False, nan=ValueError, nan_match="`points`", check=_greedy_check),
    Case("hungarian_assignment", solvers.hungarian_assignment,
         lambda **kw: kw,
         lambda kw, x: solvers.hungarian_assignment(TARGET_VECTORS @ np.asarray(x).T),
         kind="vector", layer=False, differentiable=False, nan=ValueError, nan_match="`similarity`",
         check=_hungarian_check),
]

CASES = LAYER_CASES + SOLVER_CASES


def _ids(cases):
    return [case.name for case in cases]


# --- helpers ---------------------------------------------------------------------------------------------------

def _features(case, seed=0, batch=B, spatial=None):
    shape = (batch, *(spatial or case.spatial), D) if case.kind == "map" else (batch, D)
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _zero_vectors(case, seed=0):
    """Sample 0 all zero; for feature maps also two cells of sample 1, for vectors also sample 2."""
    x = _features(case, seed)
    x[0] = 0.0
    if case.kind == "map":
        x[1, 0, 1] = 0.0
        x[1, -1, 0] = 0.0
    else:
        x[2] = 0.0
    return x


def _as_list(outputs):
    return [outputs] if not isinstance(outputs, (list, tuple)) else list(outputs)


def _numpy(outputs):
    return [np.asarray(keras.ops.convert_to_numpy(o)) for o in _as_list(outputs)]


def _functional_weights(outputs, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=np.shape(o)) for o in outputs]


def _functional(outputs, weights):
    """``sum_i <w_i, out_i>`` in float32 (float64 for float64 outputs)."""
    total = 0.0
    for out, w in zip(outputs, weights):
        dtype = tf.float64 if out.dtype == tf.float64 else tf.float32
        total += tf.reduce_sum(tf.cast(out, dtype) * tf.constant(w, dtype))
    return total


def _trainable(case, built):
    return list(built.trainable_weights) if case.layer else []


def _run(case, built, x, weights=None, seed=7):
    """Outputs, the functional's gradients w.r.t. ``x`` and the trainable weights (NumPy), and the weights used."""
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        outputs = _as_list(case.apply(built, x))
        if weights is None:
            weights = _functional_weights(outputs, seed)
        loss = _functional(outputs, weights)
    gradients = tape.gradient(loss, [x, *_trainable(case, built)])
    return _numpy(outputs), [None if g is None else np.asarray(g) for g in gradients], weights


def _select(array, keep, pairs=False):
    array = np.asarray(array)[keep]
    return array[:, keep] if pairs else array


def _assert_close_to_scale(actual, expected, relative, what):
    """``max |actual - expected| <= relative * max |expected|`` (NaN anywhere fails)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, what
    scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-12)
    gap = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    assert gap <= relative * scale, f"{what}: max |diff| {gap:.3g} > {relative:g} * scale {scale:.3g}"


def _assert_finite(arrays, what):
    for i, array in enumerate(arrays):
        assert array is not None, f"{what} {i}: no gradient"
        assert np.all(np.isfinite(np.asarray(array, np.float64))), f"{what} {i} is not finite"


def test_the_table_covers_every_public_layer_and_solver():
    # ExportableLayer is an abstract base and TaskModel a functional model: neither is a layer of its own.
    not_layers = {"ExportableLayer", "TaskModel"}
    layers = {getattr(ot_layers, name) for name in ot_layers.__all__
              if inspect.isclass(getattr(ot_layers, name)) and name not in not_layers}
    # Result types are no solvers; estimate_prototypes / simplex_etf take no tensor input (sizes only): they have
    # their own edge-case test below.
    not_in_table = {"SinkhornResult", "EMDResult", "PartialTransportResult", "estimate_prototypes", "simplex_etf"}
    public_solvers = {getattr(solvers, name) for name in solvers.__all__ if name not in not_in_table}
    covered = {case.target for case in CASES}
    assert layers <= covered, layers - covered
    assert public_solvers <= covered, public_solvers - covered
    assert {c.name for c in CASES if c.target is EMDHead} == {"EMDHead-sinkhorn", "EMDHead-exact"}
    assert {c.name for c in CASES if c.target is ManifoldProxies} == {
        "ManifoldProxies-direct", "ManifoldProxies-contextual", "ManifoldProxies-intrinsic"}


# --- zero vectors ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_zero_vectors_give_finite_outputs_and_gradients(case):
    x = _zero_vectors(case)
    built = case.build()
    if not case.differentiable:
        outputs = _numpy(case.apply(built, x))
        _assert_finite(outputs, "output")
        case.check(x, outputs)
        return
    outputs, gradients, _ = _run(case, built, x)
    _assert_finite(outputs, "output")
    _assert_finite(gradients, "gradient")  # [input, *trainable weights]
    assert len(gradients) == 1 + len(_trainable(case, built))


# --- NaN input -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_nan_input_is_confined_or_raises_the_documented_error(case):
    x = _features(case, seed=1)
    bad = x.copy()
    index = case.nan_index % B
    bad[(index, *([0] * (bad.ndim - 2)), 1)] = np.nan
    built = case.build()
    if case.nan != "confined":
        with pytest.raises(case.nan, match=case.nan_match):
            case.apply(built, bad)
        if case.graph_nan is not None:
            with pytest.raises(case.graph_nan, match=case.nan_match):
                tf.function(lambda t: case.apply(built, t))(tf.constant(bad))
        return
    keep = [i for i in range(B) if i != index]
    outputs, gradients, weights = _run(case, built, bad)
    clean_weights = [_select(w, keep, case.pairs) for w in weights]
    clean_built = case.build() if case.random else built  # a fresh layer draws the same crops again
    clean_outputs, clean_gradients, _ = _run(case, clean_built, x[keep], weights=clean_weights)
    for i, (out, clean) in enumerate(zip(outputs, clean_outputs)):
        _assert_close_to_scale(_select(out, keep, case.pairs), clean, 1e-5, f"output {i}")
    _assert_close_to_scale(gradients[0][keep], clean_gradients[0], 1e-5, "input gradient")
    # The NaN is not hidden: the bad sample's outputs show it.
    assert any(not np.all(np.isfinite(out[index])) for out in outputs)


# --- mixed precision -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", LAYER_CASES, ids=_ids(LAYER_CASES))
def test_mixed_precision_outputs_follow_the_policy_and_the_float32_run(case):
    x = _features(case, seed=2)
    reference = case.build()
    expected = _numpy(case.apply(reference, x))
    keras.mixed_precision.set_dtype_policy("mixed_float16")  # reset to float32 by conftest's autouse fixture
    layer = case.build()
    if reference.weights:
        case.apply(layer, x)  # build, then take the float32 layer's weights
        layer.set_weights(reference.get_weights())
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        raw = _as_list(case.apply(layer, xt))
        loss = _functional(raw, _functional_weights(raw, 3))
    gradients = tape.gradient(loss, [xt, *layer.trainable_weights])
    for out, ref in zip(raw, expected):
        assert keras.backend.standardize_dtype(out.dtype) == case.mixed_dtype
        assert np.all(np.isfinite(np.asarray(out, np.float64)))
        _assert_close_to_scale(np.asarray(out, np.float64), ref, 1e-2, "mixed precision output")
    _assert_finite([np.asarray(g) if g is not None else None for g in gradients], "gradient")


# --- unknown spatial size --------------------------------------------------------------------------------------

SPATIAL_CASES = [pytest.param(case, id=case.name) for case in LAYER_CASES if case.kind == "map"]


@pytest.mark.parametrize("case", SPATIAL_CASES)
def test_unknown_spatial_size_equals_fixed_size_calls(case):
    layer = case.build()
    inputs = keras.Input((None, None, D))
    model = keras.Model(inputs, case.apply(layer, inputs))
    reference = case.build() if case.random else layer  # the same random draws, call for call
    for seed, size in enumerate(case.sizes):
        x = _features(case, seed=10 + seed, spatial=size)
        predicted = _numpy(model.predict(x, verbose=0))
        expected = _numpy(case.apply(reference, x))
        assert len(predicted) == len(expected)
        for out, ref in zip(predicted, expected):
            # graph and eager kernels may round differently: the EMD head's export parity, 1e-5 of the scale
            _assert_close_to_scale(out, ref, 1e-5, f"spatial size {size}")


# --- epsilon = 1e-3 in float32 ---------------------------------------------------------------------------------

EPSILON_LAYERS = [case for case in LAYER_CASES if case.epsilon is not None]


@pytest.mark.parametrize("case", EPSILON_LAYERS, ids=_ids(EPSILON_LAYERS))
def test_layers_at_epsilon_1e_3_in_float32(case):
    x = _zero_vectors(case, seed=4)  # the sharpest setting together with zero vectors
    layer = case.build(**case.epsilon)
    outputs, gradients, _ = _run(case, layer, x)
    assert all(out.dtype == np.float32 for out in outputs)
    _assert_finite(outputs, "output")
    _assert_finite(gradients, "gradient")
    # The same layer (same weights) computing in float64: float32 stays within 1e-3 of the outputs' scale.
    in_float64 = case.build(**case.epsilon, dtype="float64")
    if layer.weights:
        case.apply(in_float64, x.astype(np.float64))
        in_float64.set_weights([np.asarray(w, np.float64) if np.asarray(w).dtype.kind == "f" else w
                                for w in layer.get_weights()])
    expected = _numpy(case.apply(in_float64, x.astype(np.float64)))
    for out, ref in zip(outputs, expected):
        _assert_close_to_scale(out, ref, 1e-3, "float32 against float64")


EPSILON_SOLVERS = [case for case in SOLVER_CASES if case.epsilon is not None]


def _pot_exact_value(name, cost):
    """POT's exact value of one problem (float64): the EMD, or the exact partial transport of mass 0.3 to
    unconstrained prototypes (rows of ``cost``, each able to take all of it)."""
    if name == "partial_transport":
        m, n = cost.shape
        return ot.partial.partial_wasserstein2(np.ones(m), np.full(n, 1.0 / n), cost, m=0.3)
    n, m = cost.shape
    return ot.emd2(np.full(n, 1.0 / n), np.full(m, 1.0 / m), cost)


@pytest.mark.parametrize("case", EPSILON_SOLVERS, ids=_ids(EPSILON_SOLVERS))
def test_solvers_at_epsilon_1e_3_in_float32_against_pot(case):
    x = _zero_vectors(case, seed=5)
    settings = case.build(**case.epsilon)
    outputs, gradients, _ = _run(case, settings, x)
    _assert_finite(outputs, "output")
    _assert_finite(gradients, "gradient")
    cost = _cosine_cost(x.astype(np.float64)).numpy()
    if case.name == "partial_transport":
        cost = np.transpose(cost, (0, 2, 1))
    plan = outputs[1] if case.name == "partial_transport" else outputs[0]
    assert plan.dtype == np.float32
    values = np.sum(plan.astype(np.float64) * cost, axis=(1, 2))  # <C, T>
    n, m = cost.shape[1:]
    # The entropic plan's cost exceeds the exact optimum by at most about epsilon * log(n m) (its entropy
    # range), plus the marginal error left at the stopping tolerance times the cost range (2).
    tolerance = 1e-3 * math.log(n * m) + 2 * max(case.epsilon["threshold"], 1e-4)
    for p in range(B):
        assert abs(values[p] - _pot_exact_value(case.name, cost[p])) <= tolerance, (p, values[p])


# --- zero-mass marginals ---------------------------------------------------------------------------------------

ZERO_A = [[1], [0, 4]]  # zero-mass entries of a, per problem
ZERO_B = [[2], []]      # zero-mass entries of b, per problem
ZERO_MASS_SOLVERS = {
    "sinkhorn-implicit": lambda c, a, b: (lambda r: (r.plan, r.value, r.transport_cost))(
        solvers.sinkhorn(c, a, b, epsilon=0.25, max_iter=5000, threshold=1e-12, gradient="implicit")),
    "sinkhorn-unrolled": lambda c, a, b: (lambda r: (r.plan, r.value, r.transport_cost))(
        solvers.sinkhorn(c, a, b, epsilon=0.25, max_iter=5000, threshold=1e-12, gradient="unrolled")),
    "emd-exact": lambda c, a, b: tuple(solvers.emd(c, a, b, method="exact")[:2]),
    "emd-sinkhorn": lambda c, a, b: tuple(solvers.emd(c, a, b, method="sinkhorn", max_iter=5000,
                                                      threshold=1e-12)[:2]),
}


def _pot_reduced(name, cost, a, b):
    """POT on the problem without its zero-mass rows and columns: the values our solver returns there."""
    if name == "emd-exact":
        return [ot.emd2(a, b, cost)]
    epsilon = 0.25 if name.startswith("sinkhorn") else SINKHORN_EPSILON
    plan = ot.sinkhorn(a, b, cost, epsilon, method="sinkhorn_log", numItermax=100_000, stopThr=1e-13)
    transport = float(np.sum(plan * cost))
    if name == "emd-sinkhorn":
        return [transport]
    entropic = transport + epsilon * float(np.sum(plan * (np.log(np.where(plan > 0, plan, 1.0)) - 1.0)))
    return [entropic, transport]


@pytest.mark.parametrize("name", list(ZERO_MASS_SOLVERS))
def test_zero_mass_marginals_solve_the_reduced_problem(name):
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 2, 3, D))
    cost = _cosine_cost(x).numpy()  # (2, 6, 3)
    n, m = cost.shape[1:]
    a, b = rng.uniform(0.2, 1.0, (2, n)), rng.uniform(0.2, 1.0, (2, m))
    for p in range(2):
        a[p, ZERO_A[p]], b[p, ZERO_B[p]] = 0.0, 0.0
    a, b = a / a.sum(-1, keepdims=True), b / b.sum(-1, keepdims=True)
    c, ta, tb = tf.constant(cost), tf.constant(a), tf.constant(b)
    with tf.GradientTape() as tape:
        tape.watch([c, ta, tb])
        outputs = ZERO_MASS_SOLVERS[name](c, ta, tb)
        loss = _functional(outputs, _functional_weights(outputs, 8))
    gradients = [np.asarray(g) for g in tape.gradient(loss, [c, ta, tb])]
    outputs = _numpy(outputs)
    _assert_finite(outputs, "output")
    _assert_finite(gradients, "gradient")  # cost, a, b
    plan = outputs[0]
    for p in range(2):
        assert np.all(plan[p][ZERO_A[p], :] == 0.0) and np.all(plan[p][:, ZERO_B[p]] == 0.0)
        if name != "emd-exact":  # documented: the gradient at a zero-mass entry is 0 (exact: finite only)
            assert np.all(gradients[1][p, ZERO_A[p]] == 0.0) and np.all(gradients[2][p, ZERO_B[p]] == 0.0)
        rows = np.setdiff1d(np.arange(n), ZERO_A[p])
        cols = np.setdiff1d(np.arange(m), ZERO_B[p])
        expected = _pot_reduced(name, cost[p][np.ix_(rows, cols)], a[p, rows], b[p, cols])
        for value, reference in zip(outputs[1:], expected):
            np.testing.assert_allclose(value[p], reference, atol=1e-9)


# --- cost exponent p -------------------------------------------------------------------------------------------

def _p_layer(name, p, dtype, **settings):
    if name == "SinkhornMatch":
        layer = SinkhornMatch(p=p, return_cost=True, dtype=dtype, **settings)
        return layer, lambda x: layer([x, _like(TARGETS, x)]), TARGETS[1, 0]
    layer = MultiProxyWasserstein(K, num_proxies=2, p=p, dtype=dtype, **settings)
    layer.build((None, *MAP, D))
    return layer, layer, np.asarray(layer.proxies)[1, 0]


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("name", ["SinkhornMatch", "MultiProxyWasserstein"])
def test_cost_exponent(name, p):
    rng = np.random.default_rng(9)
    x = rng.normal(size=(B, *MAP, D))
    for dtype in ("float32", "float64"):  # a feature along a target / proxy direction: cost 0 there
        layer, call, direction = _p_layer(name, p, dtype)
        at_zero = x.copy()
        at_zero[0, 0, 0] = 2.0 * direction
        targets = TARGETS if name == "SinkhornMatch" else np.asarray(layer.proxies)
        base, _ = pairwise_cost(flatten_feature_map(tf.constant(at_zero)), tf.constant(targets, tf.float64))
        assert float(base[0, 1, 0, 0]) <= 1e-6
        xt = tf.constant(at_zero, dtype)
        with tf.GradientTape() as tape:
            tape.watch(xt)
            outputs = _as_list(call(xt))
            loss = _functional(outputs, _functional_weights(outputs, 10))
        gradients = tape.gradient(loss, [xt, *layer.trainable_weights])
        _assert_finite(_numpy(outputs), f"output ({dtype})")
        _assert_finite([np.asarray(g) for g in gradients], f"gradient ({dtype})")

    # Away from a zero cost, float64: autodiff (implicit, at a converged plan) against central differences.
    layer, call, _ = _p_layer(name, p, "float64", epsilon=0.5, threshold=1e-12, max_iter=5000)
    weights = _functional_weights(_as_list(call(tf.constant(x))), 11)
    xt = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(xt)
        loss = _functional(_as_list(call(xt)), weights)
    gradient = tape.gradient(loss, xt).numpy()
    assert_directional_derivatives(lambda z: _functional(_as_list(call(tf.constant(z))), weights), x, gradient, rng,
                                   count=2, rtol=1e-5, atol=1e-8)


# --- estimate_prototypes (sizes, no tensor input) --------------------------------------------------------------

@pytest.mark.parametrize("k, dim, optimum", [
    (2, 1, -1.0),   # antipodal points
    (3, 2, -0.5),   # the triangle (simplex ETF)
    (4, 3, -1 / 3),  # the tetrahedron (simplex ETF)
    (4, 2, 0.0),    # d < K - 1: the square (annealed optimizer)
])
def test_estimate_prototypes_at_the_smallest_sizes(k, dim, optimum):
    prototypes = solvers.estimate_prototypes(k, dim)
    assert prototypes.shape == (k, dim) and prototypes.dtype == np.float32
    assert np.all(np.isfinite(prototypes))
    np.testing.assert_allclose(np.linalg.norm(prototypes, axis=1), 1.0, atol=1e-6)
    assert abs(max_pairwise_cosine(prototypes) - optimum) <= 1e-4


@pytest.mark.parametrize("kwargs, name", [
    (dict(num_classes=1, dim=4), "num_classes"), (dict(num_classes=3, dim=0), "dim"),
    (dict(num_classes=3, dim=2.5), "dim"), (dict(num_classes=4, dim=2, restarts=0), "restarts"),
])
def test_estimate_prototypes_rejects_bad_sizes(kwargs, name):
    with pytest.raises(ValueError, match=name):
        solvers.estimate_prototypes(**kwargs)
