"""JAX specifics of the solvers: values are unknown under ``jit``, and a data-dependent loop has no reverse-mode
gradient (``jax.lax.while_loop``), so unrolled solvers run a static-bound loop."""
import contextlib

import jax

DIFFERENTIABLE_WHILE_LOOP = False


def values_known(x):
    """True for a concrete array, also one closed over by a ``jit``-ed function; read its values on the host
    (``ops.convert_to_numpy``), since any ``jnp`` operation on it inside ``jit`` is traced."""
    return not isinstance(x, jax.core.Tracer)


def fused_small_products(matrix):
    del matrix
    return False


def fused_matvec(matrix):
    del matrix
    return False


def run_solver_loop(fn, *args):
    return fn(*args)


def host_call(fn, arrays, outputs):
    """``fn(*arrays)`` run by NumPy on the host, as ``jax.pure_callback`` (inside ``jit`` too; a batch of calls under
    ``vmap`` runs them one after another). ``outputs`` gives each result's ``(shape, dtype)`` (static under JAX).
    ``fn`` takes and returns NumPy arrays (a tuple, one per output); no gradient flows through the call."""
    import numpy as np

    shapes = [jax.ShapeDtypeStruct(tuple(shape), dtype) for shape, dtype in outputs]

    def on_host(*values):
        return tuple(np.asarray(r, dtype=d) for r, (_, d) in zip(fn(*[np.asarray(v) for v in values]), outputs))

    return list(jax.pure_callback(on_host, shapes, *arrays, vmap_method="sequential"))


def replicas_in_sync():
    """1: there is no ``tf.distribute`` replica context here (``keras.distribution`` shards the batch within one
    program, so a batch loss needs no per-replica scaling)."""
    return 1


def eager_scope():
    """Nothing: outside a stateless scope, variables always hold concrete values."""
    return contextlib.nullcontext()


def accelerator_names():
    """The models of the accelerators JAX computes on (``NVIDIA H100 80GB HBM3``), empty on a CPU-only machine."""
    return [device.device_kind for device in jax.devices() if device.platform != "cpu"]
