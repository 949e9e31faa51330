"""The edge cases of every public layer and solver (``tests/edge_cases.py``) on the active Keras backend: all-zero
feature vectors, NaN in one sample (confined, or the documented error eagerly and from ``jax.jit``), mixed precision
(``mixed_float16`` and ``mixed_bfloat16``), unknown spatial size, ``epsilon = 1e-3`` in float32 (against float64 and
POT), zero-mass marginals (against POT), batches of marginals (the mass check per problem, batch shapes that
broadcast both ways against POT, marginals closed over by ``jax.jit``) and cost exponents (against central
differences). ``tests/test_edge_cases.py`` runs the same checks under pytest on TensorFlow.

Prints one JSON line (every case's result by ``check[case]``) and exits non-zero when one fails; a failure's
traceback goes to stderr.

    KERAS_BACKEND=jax python tests/backends/check_edge_cases.py
"""
import os
import sys
import traceback

import keras

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from tests import edge_cases  # noqa: E402
from tests.backends.backend_tools import Report  # noqa: E402

CHECKS = [
    (edge_cases.check_zero_vectors, [(case.name, case) for case in edge_cases.CASES]),
    (edge_cases.check_nan_input, [(case.name, case) for case in edge_cases.CASES]),
    (edge_cases.check_mixed_precision, [(f"{case.name}-{policy}", (case, policy)) for case in edge_cases.LAYER_CASES
                                        for policy in edge_cases.MIXED_POLICIES]),
    (edge_cases.check_unknown_spatial_size, [(case.name, case) for case in edge_cases.SPATIAL_CASES]),
    (edge_cases.check_layer_at_small_epsilon, [(case.name, case) for case in edge_cases.EPSILON_LAYERS]),
    (edge_cases.check_solver_at_small_epsilon, [(case.name, case) for case in edge_cases.EPSILON_SOLVERS]),
    (edge_cases.check_zero_mass_marginals, [(name, name) for name in edge_cases.ZERO_MASS_SOLVERS]),
    (edge_cases.check_mass_check_per_problem, [(name, name) for name in edge_cases.MARGINAL_SOLVERS]),
    (edge_cases.check_broadcast_batches, [(name, name) for name in edge_cases.MARGINAL_SOLVERS]),
    (edge_cases.check_closed_over_marginals, [(name, name) for name in edge_cases.MARGINAL_SOLVERS]),
    (edge_cases.check_cost_exponent, [(f"{name}-p{p:g}", (name, p)) for name in edge_cases.COST_EXPONENT_LAYERS
                                      for p in edge_cases.COST_EXPONENTS]),
]


def main():
    report = Report("edge_cases")
    ran = 0
    for check, cases in CHECKS:
        for label, case in cases:
            key = f"{check.__name__.removeprefix('check_')}[{label}]"
            keras.utils.set_random_seed(0)  # each case from the same weights, as under pytest (tests/conftest.py)
            try:
                check(*case) if isinstance(case, tuple) else check(case)
            except Exception as failure:  # noqa: BLE001 - every failure is reported, its traceback kept
                traceback.print_exc()
                report.expect(key, False, f"{type(failure).__name__}: {str(failure)[:300]}")
            else:
                report.expect(key, True)
            ran += 1
    report.measure("cases", ran)
    report.finish()


if __name__ == "__main__":
    main()
