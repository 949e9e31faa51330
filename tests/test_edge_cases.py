"""Every public layer and solver through the same edge cases, on TensorFlow (the table of cases and the checks are
``tests/edge_cases.py``; ``tests/backends/check_edge_cases.py`` runs the same checks on JAX and PyTorch).

Zero vectors, NaN in one sample (confined, or the documented error eagerly and inside a ``tf.function``), mixed
precision, unknown spatial size, ``epsilon = 1e-3`` in float32, zero-mass marginals, batches of marginals and cost
exponents: see ``tests/edge_cases.py``. ``estimate_prototypes`` takes no tensor input; its smallest sizes are
checked here.
"""
import inspect

import numpy as np
import pytest

import ot_layers
import zoo
from ot_layers import EMDHead, ManifoldProxies, solvers
from ot_layers.solvers.prototypes import max_pairwise_cosine
from tests.edge_cases import (CASES, COST_EXPONENT_LAYERS, COST_EXPONENTS, EPSILON_LAYERS, EPSILON_SOLVERS,
                              LAYER_CASES, MARGINAL_SOLVERS, MIXED_POLICIES, SPATIAL_CASES, ZERO_MASS_SOLVERS,
                              check_broadcast_batches, check_closed_over_marginals, check_cost_exponent,
                              check_layer_at_small_epsilon, check_mass_check_per_problem, check_mixed_precision,
                              check_nan_input, check_solver_at_small_epsilon, check_unknown_spatial_size,
                              check_zero_mass_marginals, check_zero_vectors)


def _ids(cases):
    return [case.name for case in cases]


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
    # the zoo's task layers with per-sample outputs (SupportClassMeans, SplitEpisode regroup the batch)
    assert {zoo.PrototypeLogits, zoo.L2Normalization} <= covered
    assert public_solvers <= covered, public_solvers - covered
    assert {c.name for c in CASES if c.target is EMDHead} == {"EMDHead-sinkhorn", "EMDHead-exact"}
    assert {c.name for c in CASES if c.target is ManifoldProxies} == {
        "ManifoldProxies-direct", "ManifoldProxies-contextual", "ManifoldProxies-intrinsic"}


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_zero_vectors_give_finite_outputs_and_gradients(case):
    check_zero_vectors(case)


@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_nan_input_is_confined_or_raises_the_documented_error(case):
    check_nan_input(case)


@pytest.mark.parametrize("policy", list(MIXED_POLICIES))
@pytest.mark.parametrize("case", LAYER_CASES, ids=_ids(LAYER_CASES))
def test_mixed_precision_outputs_follow_the_policy_and_the_float32_run(case, policy):
    check_mixed_precision(case, policy)


@pytest.mark.parametrize("case", SPATIAL_CASES, ids=_ids(SPATIAL_CASES))
def test_unknown_spatial_size_equals_fixed_size_calls(case):
    check_unknown_spatial_size(case)


@pytest.mark.parametrize("case", EPSILON_LAYERS, ids=_ids(EPSILON_LAYERS))
def test_layers_at_epsilon_1e_3_in_float32(case):
    check_layer_at_small_epsilon(case)


@pytest.mark.parametrize("case", EPSILON_SOLVERS, ids=_ids(EPSILON_SOLVERS))
def test_solvers_at_epsilon_1e_3_in_float32_against_pot(case):
    check_solver_at_small_epsilon(case)


@pytest.mark.parametrize("name", list(ZERO_MASS_SOLVERS))
def test_zero_mass_marginals_solve_the_reduced_problem(name):
    check_zero_mass_marginals(name)


@pytest.mark.parametrize("name", MARGINAL_SOLVERS)
def test_the_mass_check_runs_per_problem(name):
    check_mass_check_per_problem(name)


@pytest.mark.parametrize("name", MARGINAL_SOLVERS)
def test_batch_shapes_broadcast_in_both_directions(name):
    check_broadcast_batches(name)


@pytest.mark.parametrize("name", MARGINAL_SOLVERS)
def test_marginals_closed_over_by_a_compiled_function(name):
    check_closed_over_marginals(name)


@pytest.mark.parametrize("p", COST_EXPONENTS)
@pytest.mark.parametrize("name", COST_EXPONENT_LAYERS)
def test_cost_exponent(name, p):
    check_cost_exponent(name, p)


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
