"""What differs between Keras backends for otzoo's solvers, in one module per backend (as Keras' own
``keras.src.backend`` folders), chosen once from ``keras.backend.backend()`` at import.

Every module gives the same names:

- ``values_known(x)``: whether ``x`` holds concrete values that Python may read (eager TensorFlow, PyTorch, a
  concrete JAX array: outside ``jit``, or closed over by a ``jit``-ed function), so that argument checks on values
  (non-negative marginals, equal masses) can run. Such checks read the values with ``ops.convert_to_numpy`` and
  compute in NumPy: inside ``jit`` any backend operation, on a concrete array too, gives a traced value;
- ``run_solver_loop(fn, *args)``: runs a solver's iteration loop (TensorFlow compiles an eager loop into one graph;
  the other backends call ``fn``);
- ``fused_small_products(matrix)``: whether batched products of matrices like ``matrix`` ``(..., n, m)`` (Gram
  matrices) and tiny linear solves are faster as fused multiply-and-sum and unrolled Cholesky steps than as dots and
  a batched solver here (TensorFlow while tracing for XLA on CPU, for ``m <= 8``);
- ``fused_matvec(matrix)``: the same for the batched matrix-vector products of the Sinkhorn iterations with
  ``matrix`` (TensorFlow under XLA, as above; PyTorch for a tensor on the CPU, whose batched matmul kernels are slow
  for many small matrices);
- ``DIFFERENTIABLE_WHILE_LOOP``: whether the backend can reverse-differentiate a ``while_loop`` whose trip count
  depends on data (JAX cannot: its unrolled solvers run a static-bound loop instead);
- ``host_call(fn, arrays, outputs)``: runs a NumPy function on the host inside a computation (the exact EMD's
  network simplex): ``tf.numpy_function`` on TensorFlow (not XLA-compilable, not exportable), ``jax.pure_callback``
  on JAX (inside ``jit`` too), NumPy on detached CPU arrays on PyTorch; ``outputs`` gives each result's
  ``(shape, dtype)``, and no gradient flows through the call (wrap it in :func:`custom_gradient`);
- ``replicas_in_sync()``: the replicas of a running ``tf.distribute`` strategy on TensorFlow, 1 elsewhere (a loss
  that returns its batch value divides it by this);
- ``accelerator_names()``: the accelerators the backend computes on (GPU models on JAX and PyTorch, TensorFlow's
  device names), empty on a CPU-only machine;
- ``eager_scope()``: a scope where variables are read and assigned eagerly (``tf.init_scope`` on TensorFlow, for a
  first call made while a ``tf.function`` is traced; nothing elsewhere).

Only the active backend's module is imported, so ``import ot_layers`` on JAX or PyTorch never imports TensorFlow.
"""
import keras

BACKEND = keras.backend.backend()

if BACKEND == "tensorflow":
    from ot_layers.backends.tensorflow_backend import (DIFFERENTIABLE_WHILE_LOOP, accelerator_names, eager_scope,
                                                       fused_matvec, fused_small_products, host_call, replicas_in_sync,
                                                       run_solver_loop, values_known)
elif BACKEND == "jax":
    from ot_layers.backends.jax_backend import (DIFFERENTIABLE_WHILE_LOOP, accelerator_names, eager_scope,
                                                fused_matvec, fused_small_products, host_call, replicas_in_sync,
                                                run_solver_loop, values_known)
elif BACKEND == "torch":
    from ot_layers.backends.torch_backend import (DIFFERENTIABLE_WHILE_LOOP, accelerator_names, eager_scope,
                                                  fused_matvec, fused_small_products, host_call, replicas_in_sync,
                                                  run_solver_loop, values_known)
else:
    raise ImportError(f"ot_layers runs on the Keras backends 'tensorflow', 'jax' and 'torch'; KERAS_BACKEND is "
                      f"{BACKEND!r}.")


def custom_gradient(forward):
    """``keras.ops.custom_gradient`` with one gradient signature on every backend.

    ``forward(*args)`` returns ``(output, grad)`` with a single tensor ``output`` and ``grad(upstream)`` returning
    one gradient per argument (a tensor; ``zeros_like`` for an argument that gets none: JAX needs a value). Keras
    calls the gradient function as ``grad(upstream)`` on TensorFlow and JAX and as ``grad(*args, upstream=...)`` on
    PyTorch; the wrapper hides that.
    """

    @keras.ops.custom_gradient
    def wrapped(*args):
        output, grad = forward(*args)

        def gradient(*received, upstream=None):
            return tuple(grad(received[-1] if upstream is None else upstream))

        return output, gradient

    return wrapped


__all__ = ["BACKEND", "accelerator_names", "custom_gradient", "DIFFERENTIABLE_WHILE_LOOP", "eager_scope",
           "fused_matvec", "fused_small_products", "host_call", "replicas_in_sync", "run_solver_loop", "values_known"]
