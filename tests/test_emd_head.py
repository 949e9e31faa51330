"""EMDHead and StructuredFC: reference values from POT, gradients, Keras checks, export (refused for exact)."""
import warnings

import keras
import numpy as np
import ot
import pytest
import tensorflow as tf

import export
from ot_layers import EMDHead, StructuredFC
from ot_layers.layers.emd_head import EXPORT_PARITY_RTOL, cosine_cost, cross_reference_weights
from ot_layers.solvers import emd
import keras_checks
from tests.gradient_checks import assert_directional_derivatives

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _reference_logits(query, support, weights, scale=12.5):
    """NumPy + ot.emd2 restatement of Zhang et al. 2022 Eq. 1-2, 11-12 (channel-centred cosine cost)."""
    q = query.reshape(query.shape[0], -1, query.shape[-1]).astype(np.float64)
    s = support.reshape(support.shape[0], -1, support.shape[-1]).astype(np.float64)
    logits = np.zeros((len(q), len(s)))
    for i, u in enumerate(q):
        for k, v in enumerate(s):
            uc, vc = u - u.mean(1, keepdims=True), v - v.mean(1, keepdims=True)
            uc /= np.linalg.norm(uc, axis=1, keepdims=True)
            vc /= np.linalg.norm(vc, axis=1, keepdims=True)
            cost = 1 - uc @ vc.T
            if weights == "uniform":
                a, b = np.full(len(u), 1 / len(u)), np.full(len(v), 1 / len(v))
            else:
                a = np.maximum(u @ v.mean(0), 0) + 1e-3
                b = np.maximum(v @ u.mean(0), 0) + 1e-3
                a, b = a / a.sum(), b / b.sum()
            logits[i, k] = scale * (1 - ot.emd2(a, b, cost))
    return logits


def _features(rng, *shape):
    return np.maximum(rng.standard_normal(shape), 0).astype(np.float32) + 0.01 * rng.random(shape).astype(np.float32)


@pytest.mark.parametrize("weights", ["cross_reference", "uniform"])
def test_exact_logits_match_pot_reference(weights):
    rng = np.random.default_rng(0)
    query, support = _features(rng, 4, 3, 3, 8), _features(rng, 5, 3, 3, 8)
    logits = EMDHead(method="exact", node_weights=weights)([query, support]).numpy()
    np.testing.assert_allclose(logits, _reference_logits(query, support, weights), atol=5e-5)


def test_transport_uniform_weights_and_plan_match_pot():
    rng = np.random.default_rng(4)
    query, support = _features(rng, 2, 6, 5), _features(rng, 3, 4, 5)
    head = EMDHead(method="exact", node_weights="uniform")
    cost, a, b, result = head.transport(tf.constant(query), tf.constant(support))
    assert cost.shape == (2, 3, 6, 4) and a.shape == (2, 3, 6) and b.shape == (2, 3, 4)
    np.testing.assert_allclose(a.numpy(), 1 / 6, atol=1e-7)
    np.testing.assert_allclose(b.numpy(), 1 / 4, atol=1e-7)
    for i in range(2):
        for k in range(3):
            value = ot.emd2(np.full(6, 1 / 6), np.full(4, 1 / 4), cost.numpy()[i, k].astype(np.float64))
            assert float(result.cost[i, k]) == pytest.approx(value, abs=1e-6)
    np.testing.assert_allclose(head([query, support]), 12.5 * (1 - result.cost.numpy()), rtol=1e-6)


def test_sinkhorn_logits_close_to_exact():
    rng = np.random.default_rng(1)
    query, support = _features(rng, 6, 5, 5, 16), _features(rng, 5, 5, 5, 16)
    exact = EMDHead(method="exact")([query, support]).numpy()
    entropic = EMDHead(method="sinkhorn")([query, support]).numpy()
    similarity_exact, similarity_entropic = exact / 12.5, entropic / 12.5
    np.testing.assert_allclose(1 - similarity_entropic, 1 - similarity_exact, rtol=0.03)
    assert np.all(np.argmax(exact, 1) == np.argmax(entropic, 1))


def test_cross_reference_weights_change_the_result():
    rng = np.random.default_rng(2)
    query, support = _features(rng, 3, 2, 2, 8), _features(rng, 4, 2, 2, 8)
    crossed = EMDHead(method="exact")([query, support]).numpy()
    uniform = EMDHead(method="exact", node_weights="uniform")([query, support]).numpy()
    assert np.max(np.abs(crossed - uniform)) > 1e-3


@pytest.mark.parametrize("method", ["exact", "sinkhorn"])
def test_gradients_reach_query_and_support(method):
    rng = np.random.default_rng(3)
    query = tf.constant(_features(rng, 3, 4, 6))
    support = tf.constant(_features(rng, 2, 4, 6))
    with tf.GradientTape() as tape:
        tape.watch([query, support])
        loss = LOSS(tf.constant([0, 1, 0]), EMDHead(method=method)([query, support]))
    d_query, d_support = tape.gradient(loss, [query, support])
    for grad in (d_query, d_support):
        assert np.all(np.isfinite(grad.numpy())) and np.max(np.abs(grad.numpy())) > 0


def test_exact_head_gradient_matches_finite_differences():
    """Through the head's own cost and cross-reference weights, in float64, w.r.t. the support features."""
    rng = np.random.default_rng(4)
    query = _features(rng, 2, 4, 5).astype(np.float64)
    support = _features(rng, 2, 4, 5).astype(np.float64)

    def value(s):
        s = tf.constant(s)
        a, b = cross_reference_weights(tf.constant(query), s)
        return tf.reduce_sum(emd(cosine_cost(tf.constant(query), s), a, b, method="exact").cost)

    s = tf.constant(support)
    with tf.GradientTape() as tape:
        tape.watch(s)
        total = value(s)
    grad = tape.gradient(total, s).numpy()
    assert_directional_derivatives(value, support, grad, rng, count=4, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("kwargs, match", [
    (dict(method="qpth"), "method"), (dict(node_weights="equal"), "node_weights"),
    (dict(scale=0), "scale"), (dict(epsilon=-1.0), "epsilon"), (dict(max_iter=0), "max_iter"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EMDHead(**kwargs)


def test_exact_method_warns_of_the_sinkhorn_settings_it_ignores(tmp_path):
    """``EMDHead(epsilon=0.05)`` (the default method is exact) used to run the network simplex without a word: a
    Sinkhorn setting given another value than its default now warns, naming it, once, where the head is made; the
    defaults, the entropic method and calls do not warn, and the exact logits are those of the default head."""
    with pytest.warns(UserWarning, match=r'EMDHead\(method="exact"\) ignores epsilon=0.05, threshold=0.0:') as caught:
        head = EMDHead(epsilon=0.05, max_iter=100, threshold=0.0)
    assert len(caught) == 1 and caught[0].filename == __file__
    rng = np.random.default_rng(7)
    query, support = rng.standard_normal((2, 4, 8)), rng.standard_normal((3, 5, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain = EMDHead(method="exact")
        EMDHead(method="sinkhorn", epsilon=0.05, max_iter=7, threshold=0.0)
        logits = head([query, support])  # the call passes no Sinkhorn setting to the exact solver
        np.testing.assert_allclose(logits.numpy(), plain([query, support]).numpy(), rtol=1e-6)
        with pytest.warns(UserWarning, match="ignores epsilon=0.05"):  # a saved head warns again when loaded
            EMDHead.from_config(head.get_config())


def test_exact_solver_warns_of_the_sinkhorn_settings_it_ignores():
    cost = np.random.default_rng(8).random((2, 3, 3))
    with pytest.warns(UserWarning, match=r"emd\(method=\"exact\"\) ignores max_iter=5, domain='log':") as caught:
        emd(cost, method="exact", max_iter=5, domain="log")
    assert len(caught) == 1 and caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        emd(cost, method="exact")
        emd(cost, method="sinkhorn", max_iter=5, domain="log")


def test_call_checks_inputs():
    """The first call's bad inputs raise the message alone, one line naming the input."""
    head = EMDHead()
    for inputs, message in [(np.zeros((2, 4, 3), np.float32), "EMDHead expects `inputs=[query, support]` (a list of "
                             "two tensors), got one tensor of shape (2, 4, 3)."),
                            ([np.ones((2, 4, 3), np.float32)], "EMDHead expects `inputs=[query, support]` (a list "
                             "of two tensors), got 1 input."),
                            ([np.ones((2, 4, 3), np.float32), np.ones((2, 4, 5), np.float32)],
                             "The feature dimension of `query` (3) does not match that of `support` (5)."),
                            ([np.ones((2, 4, 3), np.float32), np.ones((2, 3), np.float32)],
                             "`support` must have rank 3 or 4, got shape (2, 3) (rank 2).")]:
        with pytest.raises(ValueError) as raised:
            head(inputs)
        assert str(raised.value) == message


def _pair_model(method):
    query = keras.Input(shape=(3, 3, 6))
    support = keras.Input(shape=(3, 3, 6))
    return keras.Model([query, support], EMDHead(method=method)([query, support]))


def _sfc_model(method, classes=3, nodes=4, dim=6):
    def build():
        inputs = keras.Input(shape=(nodes, dim))
        x = keras.layers.Dense(dim)(inputs)
        return keras.Model(inputs, StructuredFC(classes, nodes, head={"method": method})(x))
    return build


def _pair_inputs():
    rng = np.random.default_rng(5)
    return [_features(rng, 4, 3, 3, 6), _features(rng, 3, 3, 3, 6)]


def _sfc_data():
    rng = np.random.default_rng(6)
    return rng.standard_normal((16, 4, 6)).astype(np.float32), rng.integers(0, 3, 16)


@pytest.mark.parametrize("method", ["exact", "sinkhorn"])
def test_save_load_roundtrip(method, tmp_path):
    keras_checks.assert_save_load_roundtrip(_pair_model(method), _pair_inputs(), tmp_path)
    x, _ = _sfc_data()
    model = _sfc_model(method)()
    restored = keras_checks.assert_save_load_roundtrip(model, x, tmp_path)
    assert restored.layers[-1].get_config()["head"] == {"method": method}


def test_sinkhorn_fits_with_xla():
    x, y = _sfc_data()
    keras_checks.assert_fits_with_xla(_sfc_model("sinkhorn"), x, y, LOSS)


@pytest.mark.parametrize("method", ["exact", "sinkhorn"])
def test_fits_mirrored(method):
    x, y = _sfc_data()
    keras_checks.assert_fits_mirrored(_sfc_model(method), x, y, LOSS)


def test_exact_leaves_auto_jit_off():
    model = _sfc_model("exact")()
    model.compile(optimizer="sgd", loss=LOSS, jit_compile="auto")
    assert model.jit_compile is False


@pytest.mark.parametrize("method", ["exact", "sinkhorn"])
def test_mixed_precision(method):
    reference = _pair_model(method)
    keras_checks.assert_mixed_precision(lambda: _pair_model(method), _pair_inputs(), reference, atol=0.1)


def test_sinkhorn_export_parity(tmp_path):
    # A single-input model (export.verify feeds artifacts positional inputs): the head inside StructuredFC, fed the
    # features directly. The head computes in float32; <C, T_eps> moves by ~scale * max C / epsilon times any
    # round-off in the costs, so exported graphs (whose kernels round differently) agree within EXPORT_PARITY_RTOL
    # of the logits' scale (max |diff| / max |logit|), not within 1e-5 absolute.
    x, _ = _sfc_data()
    inputs = keras.Input(shape=(4, 6))
    model = keras.Model(inputs, StructuredFC(3, 4, head={"method": "sinkhorn"})(inputs))
    logit_scale = float(np.max(np.abs(model(x[:5]))))
    assert logit_scale > 1.0  # a meaningful scale: the logits are scale * similarity with scale = 12.5
    keras_checks.assert_export_parity(model, x[:5], tmp_path, atol=EXPORT_PARITY_RTOL * logit_scale)


def test_exact_export_refuses_and_names_the_alternative(tmp_path):
    for model in (_pair_model("exact"), _sfc_model("exact")()):
        with pytest.raises(ValueError, match='method="sinkhorn"'):
            export.to_saved_model(model, str(tmp_path / "sm"))
        with pytest.raises(ValueError, match='method="sinkhorn"'):
            export.to_onnx(model, str(tmp_path / "m.onnx"))


def test_structured_fc_initializes_from_support_means():
    rng = np.random.default_rng(7)
    features = rng.standard_normal((6, 2, 2, 3)).astype(np.float32)
    labels = np.array([0, 1, 0, 1, 2, 2])
    layer = StructuredFC(3, 4, head={"method": "exact"})
    layer.initialize_from_support(features, labels)
    np.testing.assert_allclose(layer.nodes.numpy()[1], features[[1, 3]].mean(0).reshape(4, 3), atol=1e-6)
    with pytest.raises(ValueError, match="missing"):
        layer.initialize_from_support(features[:4], labels[:4])
    with pytest.raises(ValueError, match="nodes"):
        layer.initialize_from_support(features.reshape(6, 2, 6), labels)
    # each was taken (a truncated label, NaN nodes) or failed in NumPy or TensorFlow without naming the argument
    for bad_features, bad_labels, match in [
        (features, np.array([0, 1, 0, 1.5, 2, 2]), "^`labels` must be integer class labels"),
        (features, labels[:5], "^`labels` has 5 entries but `features` has 6"),
        (features, np.array([0, 1, 0, 1, 2, 7]), r"^`labels` must contain every class .* outside \[7\]"),
        (np.where(np.arange(6)[:, None, None, None] == 0, np.nan, features), labels, "^`features` hold NaN"),
    ]:
        with pytest.raises(ValueError, match=match):
            layer.initialize_from_support(bad_features, bad_labels)


def test_structured_fc_fine_tuning_names_its_settings_before_compiling():
    """Momentum 5 blew the nodes up to 1e13; an unknown setting or steps=0 failed inside tf.function ("in user
    code:" and a long trace)."""
    from training.evaluation.structured_fc import fine_tune_structured_fc
    rng = np.random.default_rng(7)
    features = rng.standard_normal((6, 2, 2, 3)).astype(np.float32)
    labels = np.array([0, 1, 0, 1, 2, 2])
    for kwargs, match in [({"momentum": 5.0}, "^`momentum`"), ({"momentum": float("nan")}, "^`momentum`"),
                          ({"steps": 0}, "^`steps` must be an integer >= 1"),
                          ({"step": 3}, r"^fine_tune_structured_fc takes .* got \['step'\]")]:
        with pytest.raises(ValueError, match=match):
            fine_tune_structured_fc(StructuredFC(3, 4), features, labels, **kwargs)
