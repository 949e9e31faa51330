"""Backend-neutral helpers of the backend checks: gradients, array conversion and the JSON report.

Each ``check_*.py`` beside this file runs under whatever ``KERAS_BACKEND`` is set (``tests/test_backend_matrix.py``
runs each one under TensorFlow, JAX and PyTorch in a fresh process), prints one JSON line with what it measured and
exits non-zero when a check fails.
"""
import json
import sys

import keras
import numpy as np

BACKEND = keras.backend.backend()
if BACKEND == "jax":
    import jax

    jax.config.update("jax_enable_x64", True)  # the float64 checks need float64 arrays


def numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


def tensor(x):
    return keras.ops.convert_to_tensor(np.asarray(x))


def torch_leaf(array):
    """``array`` as a PyTorch tensor on Keras' device (a GPU's where there is one) that records its gradient."""
    return tensor(array).detach().clone().requires_grad_(True)


def value_and_grad(fn, *arrays):
    """``(fn(*arrays), [d fn / d array])`` for a scalar ``fn`` of backend tensors, as NumPy, on the active backend."""
    if BACKEND == "jax":
        value, grads = jax.value_and_grad(fn, argnums=tuple(range(len(arrays))))(*[tensor(a) for a in arrays])
        return float(value), [np.asarray(g) for g in grads]
    if BACKEND == "torch":
        inputs = [torch_leaf(a) for a in arrays]
        value = fn(*inputs)
        value.backward()
        return float(value.detach()), [x.grad.detach().cpu().numpy() for x in inputs]
    import tensorflow as tf

    inputs = [tf.constant(a) for a in arrays]
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        value = fn(*inputs)
    return float(value), [g.numpy() for g in tape.gradient(value, inputs)]


def gradients(scalar, inputs, variables=()):
    """Gradients of the scalar ``scalar(*tensors)`` w.r.t. the arrays ``inputs`` (passed in as backend tensors) and
    the Keras ``variables`` (read inside ``scalar``), as NumPy arrays, ``None`` where the backend gives none. Layers
    must be built before (on JAX the variables are swapped for traced values through ``keras.StatelessScope``)."""
    variables = list(variables)
    if BACKEND == "jax":
        def fn(xs, ws):
            with keras.StatelessScope(state_mapping=list(zip(variables, ws))):
                return scalar(*xs)

        gx, gw = jax.grad(fn, argnums=(0, 1))([tensor(x) for x in inputs], [v.value for v in variables])
        return [np.asarray(g) for g in list(gx) + list(gw)]
    if BACKEND == "torch":
        xs = [torch_leaf(x) for x in inputs]
        params = [v.value for v in variables]
        for p in params:
            p.grad = None
        scalar(*xs).backward()
        return [None if t.grad is None else t.grad.detach().cpu().numpy() for t in xs + params]
    import tensorflow as tf

    xs = [tf.convert_to_tensor(x) for x in inputs]
    with tf.GradientTape() as tape:
        tape.watch(xs)
        value = scalar(*xs)
    return [None if g is None else np.asarray(g) for g in tape.gradient(value, xs + [v.value for v in variables])]


def jitted(fn):
    """``fn`` compiled the backend's way (``jax.jit``, ``tf.function`` with XLA); PyTorch runs eagerly."""
    if BACKEND == "jax":
        return jax.jit(fn)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn, jit_compile=True)
    return fn


def compiled_value_and_grad(fn, *arrays):
    """:func:`value_and_grad` compiled the backend's way (``jax.jit``; ``tf.function`` with XLA around the tape), or
    ``None`` on PyTorch (otzoo runs it eagerly)."""
    if BACKEND == "jax":
        step = jax.jit(jax.value_and_grad(fn, argnums=tuple(range(len(arrays)))))
        value, grads = step(*[tensor(a) for a in arrays])
        return float(value), [np.asarray(g) for g in grads]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def step(*inputs):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                value = fn(*inputs)
            return value, tape.gradient(value, inputs)

        value, grads = step(*[tf.constant(a) for a in arrays])
        return float(value), [g.numpy() for g in grads]
    return None


def fit_and_round_trip(report, model, x, y, epochs):
    """Compiles ``model`` (Adam 0.01, sparse cross-entropy on logits), records its loss on ``(x, y)`` before and
    after ``epochs`` of ``fit`` (a failure unless it drops), saves it to ``.keras`` and loads it back (a failure
    unless the outputs are equal). Returns the loaded model."""
    import tempfile

    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=epochs, batch_size=16, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    report.measure("fit_loss_before", before)
    report.measure("fit_loss_after", after)
    report.expect("fit_lowers_the_loss", after < before)
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/model.keras"
        model.save(path)
        loaded = keras.saving.load_model(path)
        report.measure("keras_round_trip", np.abs(numpy(loaded(tensor(x[:8]))) - numpy(model(tensor(x[:8])))).max(),
                       0.0)
    return loaded


def central_difference(fn, array, direction, step=1e-6):
    """``(fn(array + step d) - fn(array - step d)) / 2 step`` in float64. On JAX both evaluations run through one
    ``jax.jit`` of ``fn``: eager JAX compiles every solver loop at each call, and the difference is only the
    reference here (the eager gradient is what the checks test)."""
    if BACKEND == "jax":
        fn = jax.jit(fn)
    plus = float(numpy(fn(tensor(array + step * direction))))
    minus = float(numpy(fn(tensor(array - step * direction))))
    return (plus - minus) / (2 * step)


class Report:
    """Collects named measurements and failed checks; :meth:`finish` prints them as one JSON line and exits."""

    def __init__(self, name):
        self.record = {"check": name, "backend": BACKEND}
        self.failures = []

    def measure(self, key, value, limit=None):
        """Records ``value``; with ``limit``, a failure unless ``value <= limit``."""
        self.record[key] = float(value)
        if limit is not None and not value <= limit:
            self.failures.append(f"{key} = {value:.3g} > {limit:g}")

    def expect(self, key, condition, detail=""):
        self.record[key] = bool(condition)
        if not condition:
            self.failures.append(f"{key} {detail}".strip())

    def finish(self):
        from ot_layers.backends import accelerator_names

        self.record["accelerators"] = accelerator_names()  # what this process computed on (empty: the CPU)
        self.record["failures"] = self.failures
        print(json.dumps(self.record))
        sys.stdout.flush()
        sys.exit(1 if self.failures else 0)
