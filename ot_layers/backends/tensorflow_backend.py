"""TensorFlow specifics of the solvers: eager loops compiled into one graph, and XLA's preferred product form."""
import tensorflow as tf

DIFFERENTIABLE_WHILE_LOOP = True


def values_known(x):
    """True when running eagerly (inside ``tf.function`` a tensor's values are unknown at trace time)."""
    del x
    return tf.executing_eagerly()


# XLA on CPU runs batched products with matrices whose last axis is short (4: the MPW head) faster as fused
# multiply-and-sum, and those with a long one (16, 49: DeepEMD) faster as dots (``benchmarks/xla_cpu_products.py``);
# 8 is also the largest system the Sinkhorn backward solves by an unrolled Cholesky.
FUSED_PRODUCTS_MAX_LAST_AXIS = 8


def fused_small_products(matrix):
    """True while tracing a ``jit_compile=True`` function (:func:`in_xla_context`) for ``matrix`` ``(..., n, m)``
    with ``m <= FUSED_PRODUCTS_MAX_LAST_AXIS``: XLA on CPU runs batched matrix products and tiny linear solves of such
    matrices several times slower than fused elementwise work (the MPW head's 4 proxies), and those of longer ones
    faster (DeepEMD's 49 nodes); TensorFlow's own kernels favour the dots."""
    m = matrix.shape[-1]
    return m is not None and m <= FUSED_PRODUCTS_MAX_LAST_AXIS and in_xla_context()


def in_xla_context():
    """True while tracing a ``jit_compile=True`` function (TF's internal XLA-context marker)."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - the internal module moved
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def fused_matvec(matrix):
    """As :func:`fused_small_products` (XLA on CPU runs the batched matrix-vector products the same way)."""
    return fused_small_products(matrix)


_COMPILED = {}


def run_solver_loop(fn, *args):
    """``fn(*args)``; an eager caller gets the loop as one graph (an eager ``tf.while_loop`` runs as a slow Python
    loop). Inside a traced function the loop is built in place: a nested function call would break XLA's gradient
    of an unrolled loop."""
    if not tf.executing_eagerly():
        return fn(*args)
    if fn not in _COMPILED:
        _COMPILED[fn] = tf.function(fn, reduce_retracing=True, autograph=False)
    return _COMPILED[fn](*args)


def host_call(fn, arrays, outputs):
    """``fn(*arrays)`` run by NumPy on the host, as ``tf.numpy_function`` (an op of the graph when traced; not
    XLA-compilable, not exportable). ``outputs`` gives each result's ``(shape, dtype)``; the shape may hold ``None``
    for sizes known only at run time. ``fn`` takes and returns NumPy arrays (a tuple, one per output); no gradient
    flows through the call. An exception raised by ``fn`` surfaces as itself eagerly and as
    ``tf.errors.InvalidArgumentError`` from inside a graph."""
    results = tf.numpy_function(fn, list(arrays), [tf.as_dtype(dtype) for _, dtype in outputs], stateful=False)
    for result, (shape, _) in zip(results, outputs):
        result.set_shape(shape)
    return list(results)


def replicas_in_sync():
    """The replicas of the running ``tf.distribute`` strategy (1 outside one)."""
    context = tf.distribute.get_replica_context()
    return context.num_replicas_in_sync if context is not None else 1


def eager_scope():
    """A scope where variables are read and assigned eagerly, also while a ``tf.function`` is traced."""
    return tf.init_scope()


def accelerator_names():
    """TensorFlow's names of the GPUs it sees, empty on a CPU-only machine."""
    return [device.name for device in tf.config.list_physical_devices("GPU")]
