"""Backend check of the prototype / proxy layers and their losses (standalone script, not collected by pytest).

Under whatever ``KERAS_BACKEND`` is set (tensorflow, jax, torch), for each layer and loss ported to ``keras.ops``
(``L2Normalization``, ``SplitEpisode``, ``SupportClassMeans``, ``PrototypeLogits``, ``HypersphericalPrototypes``,
``ClassProxies``, ``ManifoldProxies``, ``HypersphericalPullLoss``, ``ManifoldProxyLoss``):

1. the output on small random float32 inputs equals a NumPy computation of the documented formula (within 1e-5);
2. gradients w.r.t. the float inputs and the trainable weights exist and are finite;
3. a tiny model holding the layer trains for one ``model.fit`` epoch with a lower loss after than before, and
   round-trips through ``model.save("x.keras")`` / ``keras.saving.load_model`` with equal outputs.

Prints one JSON line (``{"check", "backend", "checks": {...}, "failures": [...]}``, the report every backend check
prints) and exits 1 on any failure.

    KERAS_BACKEND=jax python tests/backends/check_prototype_layers.py
"""
import json
import os
import sys
import tempfile
import traceback

import keras
import numpy as np
from keras import ops

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from backend_tools import gradients as backend_gradients  # noqa: E402
from backend_tools import jitted  # noqa: E402
from ot_layers.layers.class_proxies import ClassProxies  # noqa: E402
from ot_layers.layers.hyperspherical_prototypes import HypersphericalPrototypes  # noqa: E402
from ot_layers.layers.manifold_proxies import ManifoldProxies  # noqa: E402
from ot_layers.layers.task_layers import (L2Normalization, PrototypeLogits, SplitEpisode,  # noqa: E402
                                          SupportClassMeans)
from ot_layers.losses.hyperspherical import HypersphericalPullLoss  # noqa: E402
from ot_layers.losses.manifold import ManifoldProxyLoss  # noqa: E402

BACKEND = keras.backend.backend()
TOL = 1e-5
RNG = np.random.default_rng(0)


def rand(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def np_normalize(x):
    """``x * rsqrt(max(||x||^2, 1e-12))`` (``tensor_ops.normalize_rows``) in float64."""
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.maximum((x * x).sum(-1, keepdims=True), 1e-12))


def assert_close(name, got, want, tol=TOL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {got.shape} != {want.shape}")
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    if not err <= tol:
        raise AssertionError(f"{name}: max |error| {err:.3g} > {tol}")
    return err


# --- gradients on every backend ------------------------------------------------------------------------------

def gradients(call, inputs, variables):
    """Gradients of ``sum(w * call(*inputs))`` (fixed random ``w``) w.r.t. the float arrays ``inputs`` and the
    Keras ``variables``, as NumPy arrays (``None`` where the backend gives none)."""
    probe = {}

    def scalar(*xs):
        out = call(*xs)
        if "w" not in probe:
            probe["w"] = RNG.normal(size=tuple(out.shape)).astype(np.float32)
        return ops.sum(ops.cast(out, "float32") * ops.convert_to_tensor(probe["w"]))

    return backend_gradients(scalar, inputs, variables)


def check_gradients(name, call, inputs, variables):
    grads = gradients(call, inputs, variables)
    names = [f"input{i}" for i in range(len(inputs))] + [v.path for v in variables]
    for label, g in zip(names, grads):
        if g is None:
            raise AssertionError(f"{name}: no gradient for {label}")
        if not np.all(np.isfinite(g)):
            raise AssertionError(f"{name}: non-finite gradient for {label}")
    return len(grads)


# --- training and saving -------------------------------------------------------------------------------------

def train_and_roundtrip(name, model, x, y, loss, lr=0.05):
    """One ``fit`` epoch (one full batch) lowers the loss; save / load gives the same outputs."""
    model.compile(optimizer=keras.optimizers.SGD(lr), loss=loss)
    batch = len(y)
    before = float(model.evaluate(x, y, batch_size=batch, verbose=0))
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    after = float(model.evaluate(x, y, batch_size=batch, verbose=0))
    if not (np.isfinite(after) and after < before):
        raise AssertionError(f"{name}: loss did not decrease ({before:.6g} -> {after:.6g})")
    expected = model.predict(x, batch_size=batch, verbose=0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "x.keras")
        model.save(path)
        loaded = keras.saving.load_model(path)
    got = loaded.predict(x, batch_size=batch, verbose=0)
    assert_close(f"{name} save/load", got, expected, tol=0.0)
    return loaded, {"loss_before": round(before, 6), "loss_after": round(after, 6)}


# --- the checks ----------------------------------------------------------------------------------------------

def check_l2_normalization():
    x = rand(5, 4)
    x[2] = 0.0  # an all-zero row stays zero
    layer = L2Normalization()
    err = assert_close("L2Normalization", ops.convert_to_numpy(layer(x)), np_normalize(x))
    check_gradients("L2Normalization", lambda t: layer(t), [x], [])
    inputs = keras.Input((6,))
    model = keras.Model(inputs, keras.layers.Dense(3)(L2Normalization()(keras.layers.Dense(4)(inputs))))
    xs, ys = rand(16, 6), rand(16, 3)
    _, info = train_and_roundtrip("L2Normalization", model, xs, ys, "mse")
    return {"max_err": err, **info}


def check_episode(metric):
    """SplitEpisode -> SupportClassMeans -> PrototypeLogits, the ProtoNet head."""
    ways, shots, dim = 3, 2, 4
    query, support = rand(6, dim), rand(ways * shots, dim)
    labels = np.repeat(np.arange(ways), shots).astype(np.int32)
    feats = np.concatenate([query, support])
    q, s = SplitEpisode()([feats, query])
    e1 = assert_close("SplitEpisode", np.concatenate([ops.convert_to_numpy(q), ops.convert_to_numpy(s)]), feats)
    means_layer = SupportClassMeans(ways)
    bad = labels.copy()
    bad[0] = ways + 3  # refused where its value is known, else ignored
    try:
        means_layer([support, bad])
        raise AssertionError("SupportClassMeans took a support label outside 0..ways-1 in an eager call")
    except ValueError as error:
        if f"`support_labels` must number the episode's classes 0..{ways - 1}, got {ways + 3}" not in str(error):
            raise
    if BACKEND != "torch":  # PyTorch runs the compiled function eagerly, where the label is refused
        means = ops.convert_to_numpy(jitted(lambda s, y: means_layer([s, y]))(support, bad))
        want_means = np.stack([support[bad == k].mean(0) for k in range(ways)])
        assert_close("SupportClassMeans (traced, a label ignored)", means, want_means)
    means = ops.convert_to_numpy(means_layer([support, labels]))
    want_means = np.stack([support[labels == k].mean(0) for k in range(ways)])
    e2 = assert_close("SupportClassMeans", means, want_means)
    maps = rand(ways * shots, 2, 3, dim)  # feature maps too
    e2 = max(e2, assert_close("SupportClassMeans maps", ops.convert_to_numpy(means_layer([maps, labels])),
                              np.stack([maps[labels == k].mean(0) for k in range(ways)])))
    logits_layer = PrototypeLogits(metric=metric, scale=2.5)
    got = ops.convert_to_numpy(logits_layer([query, want_means.astype(np.float32)]))
    if metric == "cosine":
        want = 2.5 * np_normalize(query) @ np_normalize(want_means).T
    else:
        want = -2.5 * ((query[:, None, :].astype(np.float64) - want_means[None]) ** 2).sum(-1)
    e3 = assert_close(f"PrototypeLogits[{metric}]", got, want)

    def head(f):  # the query images only give SplitEpisode their count: no gradient flows to them
        qq, ss = SplitEpisode()([f, ops.convert_to_tensor(query)])
        return logits_layer([qq, means_layer([ss, ops.convert_to_tensor(labels)])])

    check_gradients(f"ProtoNet head[{metric}]", head, [feats], [])

    qin, sin, lin = keras.Input((5,)), keras.Input((5,)), keras.Input((), dtype="int32")
    emb = keras.layers.Dense(dim)
    features = emb(keras.layers.Concatenate(axis=0)([qin, sin]))
    qf, sf = SplitEpisode()([features, qin])
    logits = PrototypeLogits(metric=metric, scale=2.5)([qf, SupportClassMeans(ways)([sf, lin])])
    model = keras.Model([qin, sin, lin], logits)
    n = ways * shots
    x = [rand(n, 5), rand(n, 5), labels]
    y = np.tile(np.arange(ways), shots).astype(np.int32)
    _, info = train_and_roundtrip(f"ProtoNet[{metric}]", model, x, y,
                                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return {"max_err": max(e1, e2, e3), **info}


def moved_representatives(old, z, labels, momentum=0.5):
    """The representatives' update in float64: ``c_k <- normalize(m c_k + (1 - m) mean_{y_i = k} z_i / ||z_i||)``
    for each class ``k`` in ``0..K-1`` with samples in the batch (other labels take no part)."""
    zn = np_normalize(z)
    want = np.asarray(old, np.float64).copy()
    for c in range(len(want)):
        if np.any(labels == c):
            want[c] = np_normalize(momentum * want[c] + (1.0 - momentum) * zn[labels == c].mean(0))
    return want


def check_hyperspherical():
    k, dim = 4, 5
    layer = HypersphericalPrototypes(k, dim, momentum=0.5)
    z = rand(8, dim)
    z[3] = 0.0
    layer.build((None, dim))
    perm = np.array([2, 0, 3, 1], np.int32)
    layer.assignment.assign(perm)
    protos = ops.convert_to_numpy(layer.prototypes)
    got = ops.convert_to_numpy(layer(z))
    err = assert_close("HypersphericalPrototypes", got, np_normalize(z) @ protos[perm].T.astype(np.float64))
    # representatives: c_k <- normalize(m c_k + (1 - m) mean_{y_i = k} z_i / ||z_i||) for classes in the batch
    labels = np.array([0, 0, 1, 1, 2, 0, 1, 2], np.int32)
    old = rand(k, dim)
    layer.representatives.assign(old)
    layer(z, labels=labels, training=True)
    err = max(err, assert_close("HypersphericalPrototypes representatives",
                                ops.convert_to_numpy(layer.representatives), moved_representatives(old, z, labels)))
    # a label outside 0..K-1 (-1 for unlabelled, or K) leaves its sample out, on every backend
    outside = np.array([0, -1, 1, k, 2, 0, k + 3, 2], np.int32)
    layer.representatives.assign(old)
    layer(z, labels=outside, training=True)
    err = max(err, assert_close("HypersphericalPrototypes labels outside 0..K-1",
                                ops.convert_to_numpy(layer.representatives), moved_representatives(old, z, outside)))
    check_gradients("HypersphericalPrototypes", lambda t: layer(t), [z], [])

    # the pull loss (1 - s_y)^2, mean over the batch
    loss = HypersphericalPullLoss()
    s = np.tanh(rand(6, k))
    y = np.array([0, 3, 1, 2, 2, 0], np.int32)
    got_loss = float(ops.convert_to_numpy(loss(y, s)))
    err = max(err, assert_close("HypersphericalPullLoss", got_loss, np.mean((1.0 - s[np.arange(6), y]) ** 2)))
    check_gradients("HypersphericalPullLoss", lambda t: loss(ops.convert_to_tensor(y), t), [s], [])

    xin, lin = keras.Input((6,)), keras.Input((), dtype="int32")
    head = HypersphericalPrototypes(k, dim, name="head")
    model = keras.Model([xin, lin], head(keras.layers.Dense(dim)(xin), labels=lin))
    x = [rand(16, 6), np.arange(16, dtype=np.int32) % k]
    loaded, info = train_and_roundtrip("HypersphericalPrototypes", model, x, x[1], HypersphericalPullLoss(), lr=0.1)
    reps = ops.convert_to_numpy(head.representatives)
    if not np.all(np.isfinite(reps)) or not np.allclose(np.linalg.norm(reps, axis=1), 1.0, atol=1e-5):
        raise AssertionError("HypersphericalPrototypes: representatives not updated to unit rows by fit")
    assert_close("HypersphericalPrototypes loaded prototypes",
                 ops.convert_to_numpy(loaded.get_layer("head").prototypes), ops.convert_to_numpy(head.prototypes), 0.0)
    # A layer made from a config without weights (clone_model) estimates the prototypes a fresh layer has before
    # its first predict or fit (JAX traces those calls: the layer estimates when built; it gave zero logits)
    inputs = keras.Input((dim,))
    plain = keras.Model(inputs, HypersphericalPrototypes(k, dim)(inputs))
    clone = keras.models.clone_model(plain)
    z = rand(5, dim)
    assert_close("HypersphericalPrototypes clone_model predict", clone.predict(z, verbose=0),
                 plain.predict(z, verbose=0), 1e-6)
    return {"max_err": err, **info}


def check_hyperspherical_float64():
    """Under a float64 dtype policy (``dtype="float64"``, or ``keras.config.set_floatx("float64")``) the layer
    still computes in float32 (its docstring) on every backend: logits, the labelled training update of the
    representatives, ``fit`` with ``PrototypeReassignment`` and the ``.keras`` round trip, against NumPy and the
    float32 layer (within 1e-5)."""
    from ot_layers.callbacks import PrototypeReassignment

    k, dim = 4, 5
    # the backend's float64 (float32 on JAX without jax_enable_x64)
    float64 = keras.backend.standardize_dtype(ops.convert_to_tensor(np.zeros(1), "float64").dtype)
    layer32 = HypersphericalPrototypes(k, dim, momentum=0.5)
    layer64 = HypersphericalPrototypes(k, dim, momentum=0.5, dtype="float64")
    z = rand(8, dim).astype(np.float64)
    z[3] = 0.0
    perm = np.array([1, 3, 0, 2], np.int32)
    labels = np.array([0, 0, 1, 1, 2, 0, 1, 2], np.int32)
    old = rand(k, dim)
    for layer in (layer32, layer64):
        layer.build((None, dim))
        layer.assignment.assign(perm)
        layer.representatives.assign(old)
    protos = ops.convert_to_numpy(layer32.prototypes).astype(np.float64)
    assert_close("HypersphericalPrototypes float64 prototypes", ops.convert_to_numpy(layer64.prototypes), protos, 0.0)
    want = np_normalize(z) @ protos[perm].T
    got32 = layer32(z)
    got = layer64(z)
    if keras.backend.standardize_dtype(got.dtype) != float64:
        raise AssertionError(f"HypersphericalPrototypes float64: logits dtype {got.dtype}, expected {float64}")
    err = assert_close("HypersphericalPrototypes float64", ops.convert_to_numpy(got), want)
    err = max(err, assert_close("HypersphericalPrototypes float64 vs float32", ops.convert_to_numpy(got),
                                ops.convert_to_numpy(got32)))
    # training call with labels: same logits, representatives updated as in float32 and as NumPy says
    got_train = layer64(z, labels=labels, training=True)
    layer32(z, labels=labels, training=True)
    err = max(err, assert_close("HypersphericalPrototypes float64 training", ops.convert_to_numpy(got_train), want))
    want_reps = moved_representatives(old, z, labels)
    reps64 = ops.convert_to_numpy(layer64.representatives)
    err = max(err, assert_close("HypersphericalPrototypes float64 representatives", reps64, want_reps))
    err = max(err, assert_close("HypersphericalPrototypes float64 vs float32 representatives", reps64,
                                ops.convert_to_numpy(layer32.representatives)))
    check_gradients("HypersphericalPrototypes float64", lambda t: layer64(t), [z], [])

    # a float64 model (floatx and the global policy, which Keras caches once a layer is made): fit with
    # PrototypeReassignment, then the .keras round trip
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        xin, lin = keras.Input((6,)), keras.Input((), dtype="int32")
        head = HypersphericalPrototypes(k, dim, name="head")
        model = keras.Model([xin, lin], head(keras.layers.Dense(dim)(xin), labels=lin))
        x = [rand(16, 6).astype(np.float64), np.arange(16, dtype=np.int32) % k]
        reassign = PrototypeReassignment()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=HypersphericalPullLoss())
        model.fit(x, x[1], batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[reassign])
        reps = ops.convert_to_numpy(head.representatives)
        if not np.all(np.isfinite(reps)) or not np.allclose(np.linalg.norm(reps, axis=1), 1.0, atol=1e-5):
            raise AssertionError("HypersphericalPrototypes float64: representatives not updated to unit rows by fit")
        assignment = ops.convert_to_numpy(head.assignment)
        if sorted(assignment.tolist()) != list(range(k)):
            raise AssertionError(f"HypersphericalPrototypes float64: assignment {assignment} is no permutation")
        expected = model.predict(x, batch_size=16, verbose=0)
        if keras.backend.standardize_dtype(expected.dtype) != float64:
            raise AssertionError(f"HypersphericalPrototypes float64: predictions dtype {expected.dtype}")
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "x.keras")
            model.save(path)
            loaded = keras.saving.load_model(path)
        assert_close("HypersphericalPrototypes float64 save/load", loaded.predict(x, batch_size=16, verbose=0),
                     expected, tol=0.0)
        assert_close("HypersphericalPrototypes float64 loaded assignment",
                     ops.convert_to_numpy(loaded.get_layer("head").assignment), assignment, tol=0.0)
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)
    return {"max_err": err, "reassignment_changes": reassign.changes}


def check_class_proxies(output):
    k, dim = 3, 4
    m = 2 if output == "similarities" else 1  # the packed output holds one embedding per class
    in_dim = 4 if output == "similarities" else 6
    layer = ClassProxies(k, num_proxies=m, dim=dim, output=output)
    x = rand(5, in_dim)
    got = ops.convert_to_numpy(layer(x))
    p = ops.convert_to_numpy(layer.proxies)
    if output == "similarities":
        want = np.einsum("bd,kmd->bkm", np_normalize(x), np_normalize(p))
    else:
        width = max(in_dim, dim)
        want = np.zeros((5, 1 + k * m, width))
        want[:, 0, :in_dim] = x
        want[:, 1:, :dim] = p.reshape(k * m, dim)[None]
    err = assert_close(f"ClassProxies[{output}]", got, want)
    check_gradients(f"ClassProxies[{output}]", lambda t: layer(t), [x], layer.trainable_variables)

    inputs = keras.Input((6,))
    out = ClassProxies(k, num_proxies=m, dim=dim, output=output)(keras.layers.Dense(in_dim)(inputs))
    model = keras.Model(inputs, out)
    xs = rand(16, 6)
    ys = np.tanh(rand(16, *tuple(model.output.shape[1:])))
    _, info = train_and_roundtrip(f"ClassProxies[{output}]", model, xs, ys, "mse")
    return {"max_err": err, **info}


def check_manifold(mode):
    k, dim = 3, 4
    layer = ManifoldProxies(k, dim, mode=mode)
    x = rand(6, dim)
    got = ops.convert_to_numpy(layer(x))
    err = None
    if mode == "direct":
        err = assert_close("ManifoldProxies[direct]", got,
                           np_normalize(x) @ np_normalize(ops.convert_to_numpy(layer.proxies)).T)
    elif not np.all(np.isfinite(got)):
        raise AssertionError(f"ManifoldProxies[{mode}]: non-finite output")
    check_gradients(f"ManifoldProxies[{mode}]", lambda t: layer(t), [x], [])
    # a float64 layer computes in float32 too (its float64 proxies cast; PyTorch refused to mix the two)
    wide = ManifoldProxies(k, dim, mode=mode, dtype="float64")
    wide_out = ops.convert_to_numpy(wide(x.astype(np.float64)))
    if mode == "direct":
        assert_close("ManifoldProxies[direct, float64]", wide_out,
                     np_normalize(x) @ np_normalize(ops.convert_to_numpy(wide.proxies).astype(np.float32)).T)
    elif not np.all(np.isfinite(wide_out)):
        raise AssertionError(f"ManifoldProxies[{mode}, float64]: non-finite output")

    loss = ManifoldProxyLoss(margin=0.1)
    s = rand(6, k)
    y = np.array([0, 1, 2, 2, 1, 0], np.int32)
    others = np.arange(k)[None, :] != y[:, None]
    s64 = s.astype(np.float64)
    want = np.log1p(np.where(others, np.exp(s64 - s64[np.arange(6), y][:, None] + 0.1), 0.0).sum(1)).mean()
    loss_err = assert_close("ManifoldProxyLoss", float(ops.convert_to_numpy(loss(y, s))), want)
    check_gradients("ManifoldProxyLoss", lambda t: loss(ops.convert_to_tensor(y), t), [s], [])
    # a label outside 0..K-1 (-1, or K) contributes zero on every backend (a gather took column -1 for -1)
    outside = np.array([0, -1, 2, k, 1, 0], np.int32)
    kept = (outside >= 0) & (outside < k)
    per_sample = np.zeros(6)
    for i in np.flatnonzero(kept):
        mask = np.arange(k) != outside[i]
        per_sample[i] = np.log1p(np.exp(s64[i, mask] - s64[i, outside[i]] + 0.1).sum())
    loss_err = max(loss_err, assert_close("ManifoldProxyLoss labels outside 0..K-1",
                                          float(ops.convert_to_numpy(loss(outside, s))), per_sample.mean()))

    inputs = keras.Input((6,))
    model = keras.Model(inputs, ManifoldProxies(k, dim, mode=mode)(keras.layers.Dense(dim)(inputs)))
    xs, ys = rand(12, 6), np.arange(12, dtype=np.int32) % k
    _, info = train_and_roundtrip(f"ManifoldProxies[{mode}]", model, xs, ys, ManifoldProxyLoss(), lr=0.5)
    return {"max_err": err, "loss_err": loss_err, **info}


CHECKS = {
    "L2Normalization": check_l2_normalization,
    "ProtoNet[euclidean]": lambda: check_episode("euclidean"),
    "ProtoNet[cosine]": lambda: check_episode("cosine"),
    "HypersphericalPrototypes+PullLoss": check_hyperspherical,
    "HypersphericalPrototypes[float64]": check_hyperspherical_float64,
    "ClassProxies[similarities]": lambda: check_class_proxies("similarities"),
    "ClassProxies[packed]": lambda: check_class_proxies("packed"),
    "ManifoldProxies[direct]+Loss": lambda: check_manifold("direct"),
    "ManifoldProxies[contextual]": lambda: check_manifold("contextual"),
}


def main():
    keras.utils.set_random_seed(0)
    results, failures = {}, []
    for name, check in CHECKS.items():
        try:
            results[name] = check()
        except Exception as error:  # report every check, then fail
            failures.append(f"{name}: {type(error).__name__}: {error}")
            results[name] = {"error": f"{type(error).__name__}: {error}"}
            traceback.print_exc(file=sys.stderr)
    print(json.dumps({"check": "prototype_layers", "backend": BACKEND, "checks": results, "failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
