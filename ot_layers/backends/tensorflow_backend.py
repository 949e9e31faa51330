"""TensorFlow specifics of the solvers: eager loops compiled into one graph, and XLA's preferred product form."""
import tensorflow as tf

DIFFERENTIABLE_WHILE_LOOP = True


def values_known(x):
    """True when running eagerly (inside ``tf.function`` a tensor's values are unknown at trace time)."""
    del x
    return tf.executing_eagerly()


def fused_small_products():
    """True while tracing a ``jit_compile=True`` function (TF's internal XLA-context marker): XLA on CPU runs batched
    small matrix-vector products and tiny linear solves several times slower than fused elementwise work, while
    TensorFlow's own kernels favour the dots."""
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - the internal module moved
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


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
