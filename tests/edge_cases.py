"""Every public layer and solver through the same edge cases, on whichever Keras backend is active.

One table (``CASES``) holds a row per layer / solver configuration: how to build it, how to make its inputs from a
feature tensor (a batch of feature maps ``(B, H, W, d)`` or of vectors ``(B, d)``), and its documented behaviour on
NaN input ("confined": the NaN stays out of the other samples' outputs and input gradients; or the error a host-side
check raises). The checks below run the same edge case over every row:

- all-zero feature vectors (a whole sample, and some cells of another sample): finite outputs, and finite gradients
  of a random linear functional of the outputs with respect to the inputs and the trainable weights;
- NaN in one sample: confined or the documented error (``ValueError`` eagerly; from a compiled call,
  ``tf.function`` or ``jax.jit``, the backend's runtime error with the same message). Confined: the other samples'
  outputs and input gradients equal those of the same batch with that sample clean (1e-5 of their scale; equal in
  practice, since the same kernels run on the same numbers), and their outputs equal a run on the batch without
  it within ``graph_rtol``; for batch-coupled cases outputs and gradients equal a run without it (1e-5);
- mixed precision (layers), ``mixed_float16`` and ``mixed_bfloat16``: the output in the compute dtype, finite,
  within 1e-2 (float16) or 4e-2 (bfloat16) of the float32 run's scale, with finite gradients;
- unknown spatial size (layers taking feature maps): a model on ``keras.Input((None, None, d))`` equals the layer
  called on fixed-size inputs, for two spatial sizes;
- ``epsilon = 1e-3`` in float32 (everything with an ``epsilon``): finite outputs and gradients, layers against
  their own float64 run, solvers against POT's exact (partial) EMD in float64 within the entropic bias
  ``epsilon * log(n m)`` plus the stopping tolerance;

and, where they apply: zero-mass marginals (``sinkhorn`` and ``emd``, both methods, against POT on the reduced
problem); batches of marginals (``sinkhorn`` and ``emd``: the equal-sum check per problem beside all-zero and NaN
problems, batch shapes that broadcast in both directions against POT per problem, marginals closed over by a
compiled function); and cost exponents ``p`` in {0.5, 1, 2} (``SinkhornMatch``, ``MultiProxyWasserstein``: finite
at a zero cost, autodiff against central finite differences away from it, float64).

Each ``check_*`` function raises ``AssertionError`` when its case fails. ``tests/test_edge_cases.py`` runs them under
pytest on TensorFlow; ``tests/backends/check_edge_cases.py`` runs all of them on JAX and PyTorch (the backend matrix).
The module needs no pytest (the GPU machine runs the matrix without it).
"""
import dataclasses
import itertools
import math
import re
import warnings
from typing import Callable, Optional

import keras
import numpy as np
import ot
from keras import ops

from ot_layers import (ClassProxies, EMDHead, GeneralizedSumPooling, HypersphericalPrototypes, ManifoldProxies,
                       MultiProxyWasserstein, PatchExtractor, SinkhornMatch, StructuredFC, solvers)
from ot_layers.layers.emd_head import EXPORT_PARITY_RTOL
from ot_layers.layers.task_layers import L2Normalization, PrototypeLogits
from ot_layers.layers.sinkhorn_match import pairwise_cost
from ot_layers.solvers.emd import SINKHORN_EPSILON
from ot_layers.tensor_ops import flatten_feature_map, normalize_rows
from tests.backends.backend_tools import BACKEND, gradients, numpy, tensor, value_and_grad
from tests.gradient_checks import assert_directional_derivatives

B, D, K = 3, 4, 3  # batch, feature dimension, classes
MAP = (3, 3)  # spatial size of the feature maps


def _constant(seed, shape):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


TARGETS = _constant(101, (K, 2, D))      # SinkhornMatch: a target set per class
SUPPORT = _constant(102, (K, 2, 2, D))   # EMDHead: a support feature map per class
TARGET_VECTORS = _constant(103, (3, D))  # solvers: the columns of every transport problem, hungarian's rows
PROTOTYPES = _constant(104, (K, D))      # PrototypeLogits: a class prototype per class


def _like(array, x):
    """A constant side input in the dtype of ``x`` (a tensor, KerasTensor or array)."""
    return np.asarray(array, dtype=keras.backend.standardize_dtype(x.dtype))


def _cosine_cost(x):
    """``1 - cos`` between the elements of feature maps ``(B, H, W, d)`` and ``TARGET_VECTORS``: ``(B, H*W, 3)``.
    A zero element has cosine 0 with everything (cost 1)."""
    x = ops.convert_to_tensor(x)
    flat = normalize_rows(flatten_feature_map(x))
    return 1.0 - ops.einsum("bnd,md->bnm", flat, normalize_rows(ops.convert_to_tensor(_like(TARGET_VECTORS, x))))


# --- the table -------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Case:
    """One layer or solver configuration.

    build(**overrides): the layer (``layer=True``) or the solver's keyword arguments.
    apply(built, x): the output tensor(s) for the feature tensor ``x``.
    kind: ``"map"`` (``x`` is ``(B, H, W, d)``) or ``"vector"`` (``(B, d)``).
    nan: ``"confined"`` or the error type raised eagerly, its message naming the argument ``nan_match``;
      ``graph_nan``: a compiled call (``tf.function``, ``jax.jit``) raises the backend's runtime error, with the
      same message.
    mixed_dtype: the output dtype under ``mixed_float16`` (layers; ``bfloat16`` for it under ``mixed_bfloat16``).
    epsilon: the settings for ``epsilon = 1e-3`` (``None``: the case has no ``epsilon``).
    pairs: outputs are indexed by pairs of samples (both leading axes are batch axes).
    batch_coupled: a sample's outputs depend on the other samples (``ManifoldProxies``' contextual and intrinsic
      modes, ``random_walk_similarity``): a NaN sample's documented effect is that of removing it from the batch.
    random: fresh random draws on every call (PatchExtractor's sampling mode).
    nan_index: the sample made NaN; check: extra checks of a host solver's outputs ``check(x, outputs)``.
    graph_rtol: a compiled model against eager calls, relative to the outputs' scale (the EMD head's Sinkhorn stops
      at a threshold, and a problem whose error lands within round-off of it can take one update more or fewer in
      a graph: its documented export parity, ``EXPORT_PARITY_RTOL``).
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
    batch_coupled: bool = False
    random: bool = False
    nan_index: int = 1
    check: Optional[Callable] = None
    graph_rtol: float = 1e-5


def _greedy_check(x, outputs):
    """Farthest-point traversal: distinct indices, each the farthest point from those chosen before it."""
    points = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    (chosen,) = outputs
    assert len(set(chosen.tolist())) == len(chosen) == 4 and chosen.min() >= 0 and chosen.max() < len(points)
    for i in range(1, len(chosen)):
        distance = np.min(((points[:, None, :] - points[None, chosen[:i], :]) ** 2).sum(-1), axis=1)
        assert abs(distance[chosen[i]] - distance.max()) <= 1e-12


def _hungarian_check(x, outputs):
    """The assignment is a bijection and as good as the best of every permutation (brute force)."""
    similarity = TARGET_VECTORS.astype(np.float64) @ np.asarray(x, np.float64).T
    (sigma,) = outputs
    assert len(sigma) == similarity.shape[0] and len(set(sigma.tolist())) == len(sigma)
    assert sigma.min() >= 0 and sigma.max() < similarity.shape[1]
    best = max(sum(similarity[k, s[k]] for k in range(len(s)))
               for s in itertools.permutations(range(similarity.shape[1]), similarity.shape[0]))
    assert abs(sum(similarity[k, sigma[k]] for k in range(len(sigma))) - best) <= 1e-12


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
         epsilon=dict(epsilon=1e-3, max_iter=10_000, threshold=1e-3), graph_rtol=EXPORT_PARITY_RTOL),
    Case("EMDHead-exact", EMDHead,
         lambda **kw: EMDHead(method="exact", **kw),
         lambda layer, x: layer([x, _like(SUPPORT, x)]),
         nan=ValueError, graph_nan=True, nan_match="`cost`.*finite"),
    Case("StructuredFC-sinkhorn", StructuredFC,
         lambda dtype=None, **kw: StructuredFC(K, num_nodes=4, head=dict(method="sinkhorn", **kw), dtype=dtype),
         lambda layer, x: layer(x),
         epsilon=dict(epsilon=1e-3, max_iter=10_000, threshold=1e-3), graph_rtol=EXPORT_PARITY_RTOL),
    Case("StructuredFC-exact", StructuredFC,
         lambda **kw: StructuredFC(K, num_nodes=4, head=dict(method="exact"), **kw),
         lambda layer, x: layer(x),
         nan=ValueError, graph_nan=True, nan_match="`cost`.*finite"),
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
         kind="vector", batch_coupled=mode != "direct")  # the contextual / intrinsic modes cut bad samples out
    for mode in ("direct", "contextual", "intrinsic")
] + [
    # The zoo's task layers on per-sample vectors (SupportClassMeans and SplitEpisode regroup the batch instead).
    Case(f"PrototypeLogits-{metric}", PrototypeLogits,
         lambda metric=metric, **kw: PrototypeLogits(metric=metric, scale=2.0, **kw),
         lambda layer, x: layer([x, _like(PROTOTYPES, x)]),
         kind="vector")
    for metric in ("euclidean", "cosine")
] + [
    Case("L2Normalization", L2Normalization, lambda **kw: L2Normalization(**kw), lambda layer, x: layer(x),
         kind="vector"),
]

SOLVER_CASES = [
    Case("sinkhorn", solvers.sinkhorn,
         lambda **kw: kw,
         lambda kw, x: (lambda r: (r.plan, r.value, r.transport_cost))(solvers.sinkhorn(_cosine_cost(x), **kw)),
         layer=False, epsilon=dict(epsilon=1e-3, max_iter=10_000, threshold=1e-4)),
    Case("partial_transport", solvers.partial_transport,
         lambda **kw: kw,
         lambda kw, x: tuple(solvers.partial_transport(ops.transpose(_cosine_cost(x), [0, 2, 1]), 0.3, **kw)[:2]),
         layer=False, epsilon=dict(epsilon=1e-3, max_iter=1000, threshold=1e-6)),
    Case("emd-exact", solvers.emd,
         lambda **kw: kw,
         lambda kw, x: tuple(solvers.emd(_cosine_cost(x), method="exact", **kw)[:2]),
         layer=False, nan=ValueError, graph_nan=True,
         nan_match="`cost`.*finite"),
    Case("emd-sinkhorn", solvers.emd,
         lambda **kw: kw,
         lambda kw, x: tuple(solvers.emd(_cosine_cost(x), method="sinkhorn", **kw)[:2]),
         layer=False, epsilon=dict(epsilon=1e-3, max_iter=10_000, threshold=1e-4)),
    Case("random_walk_similarity", solvers.random_walk_similarity,
         lambda **kw: kw,
         lambda kw, x: solvers.random_walk_similarity(x, **kw),
         kind="vector", layer=False, pairs=True, batch_coupled=True),
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
    return [numpy(o) for o in _as_list(outputs)]


def _functional_weights(outputs, seed):
    rng = np.random.default_rng(seed)
    return [rng.normal(size=np.shape(o)) for o in outputs]


def _functional(outputs, weights):
    """``sum_i <w_i, out_i>`` in float32 (float64 for float64 outputs)."""
    total = 0.0
    for out, w in zip(outputs, weights):
        dtype = "float64" if keras.backend.standardize_dtype(out.dtype) == "float64" else "float32"
        total += ops.sum(ops.cast(out, dtype) * ops.convert_to_tensor(np.asarray(w, dtype)))
    return total



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


def _trainable(case, built):
    return list(built.trainable_weights) if case.layer else []


def _run(case, built, x, weights=None, seed=7):
    """Outputs, the functional's gradients w.r.t. ``x`` and the trainable weights (NumPy), and the weights used.
    The case is applied once for its outputs (which builds a layer) and once inside the gradient."""
    outputs = _as_list(case.apply(built, tensor(x)))
    if weights is None:
        weights = _functional_weights(outputs, seed)
    grads = gradients(lambda t: _functional(_as_list(case.apply(built, t)), weights), [x], _trainable(case, built))
    return _numpy(outputs), grads, weights


def _compiled(fn):
    """``fn`` in the backend's graph (``tf.function``; ``jax.jit``) and the error a failed host check raises there,
    or ``(None, None)`` on PyTorch, which otzoo runs eagerly."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn), tf.errors.InvalidArgumentError
    if BACKEND == "jax":
        import jax

        return jax.jit(fn), jax.errors.JaxRuntimeError
    return None, None


def _assert_raises(error, pattern, fn, *args):
    try:
        fn(*args)
    except error as raised:
        assert re.search(pattern, str(raised)), f"{type(raised).__name__} does not match {pattern!r}: {raised}"
    else:
        raise AssertionError(f"no {error.__name__} raised")


# --- zero vectors ----------------------------------------------------------------------------------------------

def check_zero_vectors(case):
    """All-zero feature vectors: finite outputs and gradients (a host solver: valid outputs)."""
    x = _zero_vectors(case)
    built = case.build()
    if not case.differentiable:
        outputs = _numpy(case.apply(built, x))
        _assert_finite(outputs, "output")
        case.check(x, outputs)
        return
    outputs, grads, _ = _run(case, built, x)
    _assert_finite(outputs, "output")
    _assert_finite(grads, "gradient")  # [input, *trainable weights]
    assert len(grads) == 1 + len(_trainable(case, built))


# --- NaN input -------------------------------------------------------------------------------------------------

def check_nan_input(case):
    """A NaN in one sample stays in that sample, or raises the documented error (eagerly and compiled)."""
    x = _features(case, seed=1)
    bad = x.copy()
    index = case.nan_index % B
    bad[(index, *([0] * (bad.ndim - 2)), 1)] = np.nan
    built = case.build()
    if case.nan != "confined":
        _assert_raises(case.nan, case.nan_match, case.apply, built, bad)
        compiled, error = _compiled(lambda t: case.apply(built, t))
        if case.graph_nan and compiled is not None:
            _assert_raises(error, case.nan_match, lambda: numpy(_as_list(compiled(tensor(bad)))[0]))
        return
    keep = [i for i in range(B) if i != index]
    outputs, grads, weights = _run(case, built, bad)
    fresh = (lambda: case.build()) if case.random else (lambda: built)  # a fresh layer draws the same crops again
    if case.batch_coupled:
        without_weights = [_select(w, keep, case.pairs) for w in weights]
        without_outputs, without_grads, _ = _run(case, fresh(), x[keep], weights=without_weights)
        for i, (out, clean) in enumerate(zip(outputs, without_outputs)):
            _assert_close_to_scale(_select(out, keep, case.pairs), clean, 1e-5, f"output {i}")
        _assert_close_to_scale(grads[0][keep], without_grads[0], 1e-5, "input gradient")
    else:
        # Against the same batch with the sample clean: a batch of another size may run other kernels, and their
        # round-off (one unit in a cost) moved StructuredFC-sinkhorn's input gradient by up to 1.2e-4 of its scale
        # over 60 weight draws (4.4e-3 where a problem stopped at max_iter unconverged) at epsilon 0.03.
        clean_outputs, clean_grads, _ = _run(case, fresh(), x, weights=weights)
        for i, (out, clean) in enumerate(zip(outputs, clean_outputs)):
            _assert_close_to_scale(_select(out, keep), _select(clean, keep), 1e-5, f"output {i}")
        _assert_close_to_scale(grads[0][keep], clean_grads[0][keep], 1e-5, "input gradient")
        # Each sample solved alone (per-problem stopping): the outputs equal a run without the sample, up to a
        # threshold stop moved by round-off (``graph_rtol``).
        without_outputs = _numpy(case.apply(fresh(), tensor(x[keep])))
        for i, (out, clean) in enumerate(zip(outputs, without_outputs)):
            _assert_close_to_scale(_select(out, keep), clean, case.graph_rtol, f"output {i} without the sample")
    # The NaN is not hidden: the bad sample's outputs show it.
    assert any(not np.all(np.isfinite(out[index])) for out in outputs), "the NaN sample's outputs are finite"


# --- mixed precision -------------------------------------------------------------------------------------------

# The limit against the float32 run, relative to its scale: about 20 units of float16's rounding (2^-11) and 10 of
# bfloat16's (2^-8). The EMD heads' cross-reference weights are ill-conditioned for a nearly orthogonal query and
# class: over 40 draws of StructuredFC's nodes on JAX the worst moved by 1.8e-2 (float16) and 3.8e-2 (bfloat16),
# the seeded draw 1e-3 (exact) and 2.5e-3 (Sinkhorn) on JAX (docs/results/emd.md).
MIXED_POLICIES = {"mixed_float16": 1e-2, "mixed_bfloat16": 4e-2}


def check_mixed_precision(case, policy="mixed_float16"):
    """Under ``policy`` (one of :data:`MIXED_POLICIES`) a layer's outputs are in its documented dtype, finite,
    within the policy's limit of the float32 run's scale, with finite gradients. Restores the ``float32`` policy."""
    x = _features(case, seed=2)
    reference = case.build()
    expected = _numpy(case.apply(reference, x))
    keras.mixed_precision.set_dtype_policy(policy)
    dtype = case.mixed_dtype if case.mixed_dtype == "float32" else policy.removeprefix("mixed_")
    try:
        layer = case.build()
        if reference.weights:
            case.apply(layer, x)  # build, then take the float32 layer's weights
            layer.set_weights(reference.get_weights())
        raw = _as_list(case.apply(layer, tensor(x)))
        for out, ref in zip(raw, expected):
            assert keras.backend.standardize_dtype(out.dtype) == dtype, out.dtype
            out = numpy(out).astype(np.float64)
            assert np.all(np.isfinite(out)), "mixed precision output is not finite"
            _assert_close_to_scale(out, ref, MIXED_POLICIES[policy], f"{policy} output")
        _, grads, _ = _run(case, layer, x, seed=3)
        _assert_finite(grads, "gradient")
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


# --- unknown spatial size --------------------------------------------------------------------------------------

SPATIAL_CASES = [case for case in LAYER_CASES if case.kind == "map"]


def check_unknown_spatial_size(case):
    """A model on ``keras.Input((None, None, d))`` equals the layer called on two fixed spatial sizes."""
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
            # graph and eager kernels may round differently (see ``Case.graph_rtol``)
            _assert_close_to_scale(out, ref, case.graph_rtol, f"spatial size {size}")


# --- epsilon = 1e-3 in float32 ---------------------------------------------------------------------------------

EPSILON_LAYERS = [case for case in LAYER_CASES if case.epsilon is not None]


def check_layer_at_small_epsilon(case):
    """``epsilon = 1e-3`` with zero vectors, float32: finite outputs and gradients, within 1e-3 of the scale of
    the same layer computing in float64."""
    x = _zero_vectors(case, seed=4)  # the sharpest setting together with zero vectors
    layer = case.build(**case.epsilon)
    outputs, grads, _ = _run(case, layer, x)
    assert all(out.dtype == np.float32 for out in outputs)
    _assert_finite(outputs, "output")
    _assert_finite(grads, "gradient")
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


def check_solver_at_small_epsilon(case):
    """``epsilon = 1e-3`` with zero vectors, float32: finite outputs and gradients, and the plan's cost within the
    entropic bias of POT's exact optimum."""
    x = _zero_vectors(case, seed=5)
    settings = case.build(**case.epsilon)
    outputs, grads, _ = _run(case, settings, x)
    _assert_finite(outputs, "output")
    _assert_finite(grads, "gradient")
    cost = numpy(_cosine_cost(x.astype(np.float64)))
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
        exact = _pot_exact_value(case.name, cost[p])
        assert abs(values[p] - exact) <= tolerance, f"problem {p}: {values[p]:.6g} vs POT's {exact:.6g}"


# --- zero-mass marginals ---------------------------------------------------------------------------------------

ZERO_A = [[1], [0, 4]]  # zero-mass entries of a, per problem
ZERO_B = [[2], []]      # zero-mass entries of b, per problem
# The solvers checked against POT on problems given by their marginals (results in full).
SOLVES = {
    "sinkhorn-implicit": lambda c, a, b: solvers.sinkhorn(c, a, b, epsilon=0.25, max_iter=5000, threshold=1e-12,
                                                          gradient="implicit"),
    "sinkhorn-unrolled": lambda c, a, b: solvers.sinkhorn(c, a, b, epsilon=0.25, max_iter=5000, threshold=1e-12,
                                                          gradient="unrolled"),
    "emd-exact": lambda c, a, b: solvers.emd(c, a, b, method="exact"),
    "emd-sinkhorn": lambda c, a, b: solvers.emd(c, a, b, method="sinkhorn", max_iter=5000, threshold=1e-12),
}


def _compared(name, result):
    """The outputs of ``name``'s ``result`` that :func:`_pot_reduced` gives after the plan: ``(plan, value,
    transport_cost)`` of a Sinkhorn result, ``(plan, cost)`` of an EMD result."""
    if name.startswith("sinkhorn"):
        return result.plan, result.value, result.transport_cost
    return tuple(result[:2])


ZERO_MASS_SOLVERS = {name: (lambda c, a, b, name=name: _compared(name, SOLVES[name](c, a, b))) for name in SOLVES}


def _pot_reduced(name, cost, a, b):
    """POT on the problem without its zero-mass rows and columns (the whole problem when it has none): the values
    our solver returns there after the plan."""
    if name == "emd-exact":
        return [ot.emd2(a, b, cost)]
    epsilon = 0.25 if name.startswith("sinkhorn") else SINKHORN_EPSILON
    plan = ot.sinkhorn(a, b, cost, epsilon, method="sinkhorn_log", numItermax=100_000, stopThr=1e-13)
    transport = float(np.sum(plan * cost))
    if name == "emd-sinkhorn":
        return [transport]
    entropic = transport + epsilon * float(np.sum(plan * (np.log(np.where(plan > 0, plan, 1.0)) - 1.0)))
    return [entropic, transport]


def check_zero_mass_marginals(name):
    """Marginals with zero-mass entries (float64): finite outputs and gradients, no mass on those rows and
    columns, a zero gradient there (exact EMD: finite only), and POT's values on the reduced problem."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 2, 3, D))
    cost = numpy(_cosine_cost(x))  # (2, 6, 3)
    n, m = cost.shape[1:]
    a, b = rng.uniform(0.2, 1.0, (2, n)), rng.uniform(0.2, 1.0, (2, m))
    for p in range(2):
        a[p, ZERO_A[p]], b[p, ZERO_B[p]] = 0.0, 0.0
    a, b = a / a.sum(-1, keepdims=True), b / b.sum(-1, keepdims=True)
    solve = ZERO_MASS_SOLVERS[name]
    outputs = _numpy(solve(tensor(cost), tensor(a), tensor(b)))
    weights = _functional_weights(outputs, 8)
    grads = gradients(lambda c, ta, tb: _functional(_as_list(solve(c, ta, tb)), weights), [cost, a, b])
    _assert_finite(outputs, "output")
    _assert_finite(grads, "gradient")  # cost, a, b
    plan = outputs[0]
    for p in range(2):
        assert np.all(plan[p][ZERO_A[p], :] == 0.0) and np.all(plan[p][:, ZERO_B[p]] == 0.0)
        if name != "emd-exact":  # documented: the gradient at a zero-mass entry is 0 (exact: finite only)
            assert np.all(grads[1][p, ZERO_A[p]] == 0.0) and np.all(grads[2][p, ZERO_B[p]] == 0.0)
        rows = np.setdiff1d(np.arange(n), ZERO_A[p])
        cols = np.setdiff1d(np.arange(m), ZERO_B[p])
        expected = _pot_reduced(name, cost[p][np.ix_(rows, cols)], a[p, rows], b[p, cols])
        for value, reference in zip(outputs[1:], expected):
            np.testing.assert_allclose(value[p], reference, atol=1e-9)


# --- batches of marginals -------------------------------------------------------------------------------------

MARGINAL_SOLVERS = ("sinkhorn-implicit", "emd-exact", "emd-sinkhorn")


def _no_runtime_warnings(fn, *args):
    """``fn(*args)``, failing on a ``RuntimeWarning`` (0/0 in the host solver, an infeasible problem)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    raised = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert not raised, raised
    return result


def check_mass_check_per_problem(name):
    """The equal-sum check of ``a`` and ``b`` runs per problem: beside a problem whose sums differ, an all-zero
    problem (allowed) or a NaN marginal (confined to its problem) leaves the error that problem raises alone (their
    NaN gap disabled the check for the whole batch, and the exact EMD then solved a rescaled ``b``). An all-zero
    problem beside a valid one solves without warnings: a zero plan, value and potentials, the other problem
    POT's."""
    rng = np.random.default_rng(11)
    cost = rng.uniform(size=(2, 3, 4))
    a, b = np.stack([np.zeros(3), np.full(3, 1 / 3)]), np.stack([np.zeros(4), np.full(4, 0.5)])
    solve = SOLVES[name]
    message = r"`a` and `b` must have equal sums per problem \(relative gap 0.5\)\.$"
    _assert_raises(ValueError, message, solve, tensor(cost[1]), tensor(a[1]), tensor(b[1]))
    _assert_raises(ValueError, message, solve, tensor(cost), tensor(a), tensor(b))
    with_nan = a.copy()
    with_nan[0] = [np.nan, 0.5, 0.5]
    b_nan = np.stack([np.full(4, 0.25), b[1]])
    _assert_raises(ValueError, message, solve, tensor(cost), tensor(with_nan), tensor(b_nan))

    b[1] = 0.25
    result = _no_runtime_warnings(solve, tensor(cost), tensor(a), tensor(b))
    outputs = _numpy(_compared(name, result))
    _assert_finite(outputs, "output")
    for output in outputs + _numpy((result.f, result.g)):
        assert np.all(output[0] == 0.0), output[0]
    for value, reference in zip(outputs[1:], _pot_reduced(name, cost[1], a[1], b[1])):
        np.testing.assert_allclose(value[1], reference, atol=1e-9)


# (cost, a, b) batch shapes that broadcast to (2, 3) problems in both directions (None: a uniform marginal).
BROADCAST_BATCHES = [((), (2, 1), (1, 3)), ((), (2, 1), (3,)), ((2, 1), None, (3,))]


def _marginals(rng, batch, size):
    weights = rng.uniform(0.2, 1.0, (*batch, size))
    return weights / weights.sum(-1, keepdims=True)


def check_broadcast_batches(name):
    """``cost``, ``a`` and ``b`` whose batch shapes broadcast in both directions ((2, 1) with (3,), say) are
    broadcast to their common batch shape, every problem POT's (sinkhorn failed in the backend naming no argument;
    the exact EMD solved (2, 1) problems, with a wrongly shaped cost and uninitialised potentials); batch shapes
    that clash are refused naming the marginal."""
    rng = np.random.default_rng(12)
    n, m = 3, 4
    for cost_batch, a_batch, b_batch in BROADCAST_BATCHES:
        batch = np.broadcast_shapes(cost_batch, *(x for x in (a_batch, b_batch) if x is not None))
        cost = rng.uniform(size=(*cost_batch, n, m))
        a, b = (None if x is None else _marginals(rng, x, size) for x, size in ((a_batch, n), (b_batch, m)))
        result = SOLVES[name](tensor(cost), *(None if x is None else tensor(x) for x in (a, b)))
        what = f"cost {cost_batch}, a {a_batch}, b {b_batch}"
        outputs = _numpy(_compared(name, result))
        f, g = _numpy((result.f, result.g))
        assert outputs[0].shape == (*batch, n, m) and f.shape == (*batch, n) and g.shape == (*batch, m), what
        assert all(output.shape == batch for output in outputs[1:]), what
        cost, a, b = (np.broadcast_to(x, (*batch, *x.shape[-k:])) for x, k in
                      ((cost, 2), (np.full(n, 1 / n) if a is None else a, 1), (b, 1)))
        for index in np.ndindex(*batch):
            np.testing.assert_allclose(outputs[0][index].sum(-2), b[index], atol=1e-9, err_msg=what)
            for value, reference in zip(outputs[1:], _pot_reduced(name, cost[index], a[index], b[index])):
                np.testing.assert_allclose(value[index], reference, atol=1e-9, err_msg=f"{what}, problem {index}")
    _assert_raises(ValueError, re.escape("`b` has batch shape (3,), which does not broadcast to the batch shape "
                                         "(2,) of `cost` and `a`."),
                   SOLVES[name], tensor(rng.uniform(size=(n, m))), tensor(_marginals(rng, (2,), n)),
                   tensor(_marginals(rng, (3,), m)))


def check_closed_over_marginals(name):
    """Marginals held as backend tensors and closed over by a compiled function of the cost (``jax.jit``,
    ``tf.function``; PyTorch eagerly): the value, and on JAX its ``jit``-ed gradient, equal the eager call's. On JAX
    such concrete arrays are checked on the host inside ``jit`` (a traced comparison of them crashed the trace):
    negative weights are refused naming ``a``."""
    rng = np.random.default_rng(13)
    cost = rng.uniform(size=(4, 5))
    a, b = tensor(_marginals(rng, (), 4)), tensor(_marginals(rng, (), 5))

    def value(c, a=a):
        return ops.sum(_compared(name, SOLVES[name](c, a, b))[1])

    eager, (eager_gradient,) = value_and_grad(value, cost)
    compiled, _ = _compiled(value)
    if compiled is None:  # PyTorch: otzoo runs it eagerly
        return
    np.testing.assert_allclose(float(numpy(compiled(tensor(cost)))), eager, rtol=1e-9, atol=1e-12)
    if BACKEND == "jax":
        import jax

        jitted_value, jitted_gradient = jax.jit(jax.value_and_grad(value))(tensor(cost))
        np.testing.assert_allclose(float(jitted_value), eager, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(np.asarray(jitted_gradient), eager_gradient, rtol=1e-7, atol=1e-9)
        negative = tensor(np.array([0.5, 0.5, 0.25, -0.25]))
        _assert_raises(ValueError, "`a` must be non-negative", jax.jit(lambda c: value(c, negative)), tensor(cost))


# --- cost exponent p -------------------------------------------------------------------------------------------

COST_EXPONENTS = (0.5, 1.0, 2.0)
COST_EXPONENT_LAYERS = ("SinkhornMatch", "MultiProxyWasserstein")


def _p_layer(name, p, dtype, **settings):
    if name == "SinkhornMatch":
        layer = SinkhornMatch(p=p, return_cost=True, dtype=dtype, **settings)
        return layer, lambda x: layer([x, _like(TARGETS, x)]), TARGETS[1, 0]
    layer = MultiProxyWasserstein(K, num_proxies=2, p=p, dtype=dtype, **settings)
    layer.build((None, *MAP, D))
    return layer, layer, numpy(layer.proxies)[1, 0]


def check_cost_exponent(name, p):
    """Cost exponent ``p``: finite outputs and gradients at a zero cost (float32 and float64), and away from it
    (float64) the implicit gradient at a converged plan against central differences."""
    rng = np.random.default_rng(9)
    x = rng.normal(size=(B, *MAP, D))
    for dtype in ("float32", "float64"):  # a feature along a target / proxy direction: cost 0 there
        layer, call, direction = _p_layer(name, p, dtype)
        at_zero = x.copy()
        at_zero[0, 0, 0] = 2.0 * direction
        targets = TARGETS if name == "SinkhornMatch" else numpy(layer.proxies)
        base, _ = pairwise_cost(flatten_feature_map(tensor(at_zero)), ops.convert_to_tensor(targets, "float64"))
        assert float(numpy(base)[0, 1, 0, 0]) <= 1e-6
        at_zero = at_zero.astype(dtype)
        outputs = _numpy(call(tensor(at_zero)))
        weights = _functional_weights(outputs, 10)
        grads = gradients(lambda t: _functional(_as_list(call(t)), weights), [at_zero], layer.trainable_weights)
        _assert_finite(outputs, f"output ({dtype})")
        _assert_finite(grads, f"gradient ({dtype})")

    # Away from a zero cost, float64: autodiff (implicit, at a converged plan) against central differences.
    layer, call, _ = _p_layer(name, p, "float64", epsilon=0.5, threshold=1e-12, max_iter=5000)
    weights = _functional_weights(_numpy(call(tensor(x))), 11)
    (gradient,) = gradients(lambda t: _functional(_as_list(call(t)), weights), [x])
    assert_directional_derivatives(lambda z: numpy(_functional(_as_list(call(tensor(z))), weights)), x, gradient,
                                   rng, count=2, rtol=1e-5, atol=1e-8)
