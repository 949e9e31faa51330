"""JAX specifics of the solvers: values are unknown under ``jit``, and a data-dependent loop has no reverse-mode
gradient (``jax.lax.while_loop``), so unrolled solvers run a static-bound loop."""
import jax

DIFFERENTIABLE_WHILE_LOOP = False


def values_known(x):
    return not isinstance(x, jax.core.Tracer)


def fused_small_products():
    return False


def run_solver_loop(fn, *args):
    return fn(*args)
