"""SinkhornMatch and MultiProxyWasserstein: shapes, errors, and the Keras checks every layer passes."""
import keras
import numpy as np
import pytest

import keras_checks
from ot_layers import MultiProxyWasserstein, SinkhornMatch
from ot_layers.solvers import sinkhorn

RNG = np.random.default_rng(0)
X_MAP = RNG.normal(size=(16, 4, 4, 8)).astype("float32")
Y = RNG.integers(0, 3, size=16).astype("int32")
CLASS_SETS = RNG.normal(size=(3, 2, 8)).astype("float32")
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def build_mpw_model(gradient="implicit"):
    inputs = keras.Input((4, 4, 8))
    features = keras.layers.Conv2D(8, 1, name="conv")(inputs)
    logits = MultiProxyWasserstein(3, num_proxies=2, max_iter=30, gradient=gradient, name="mpw")(features)
    return keras.Model(inputs, logits)


def build_match_model():
    inputs = keras.Input((4, 4, 8))
    features = keras.layers.Dense(8, name="proj")(inputs)
    plans, costs = SinkhornMatch(max_iter=30, return_cost=True, name="match")([features, CLASS_SETS])
    # A classifier from the OT costs: a lower cost to a class set means a larger logit.
    logits = keras.layers.Rescaling(-10.0, name="negated")(costs)
    return keras.Model(inputs, logits)


BUILDERS = {"mpw": build_mpw_model, "match": build_match_model}


def test_match_plans_are_sinkhorn_plans_of_the_cosine_cost():
    features = RNG.normal(size=(2, 5, 4)).astype("float32")
    sets = RNG.normal(size=(3, 2, 4)).astype("float32")
    plans, costs = SinkhornMatch(threshold=0.0, max_iter=200, return_cost=True)([features, sets])
    assert plans.shape == (2, 3, 5, 2) and costs.shape == (2, 3)
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    cost = 1.0 - np.einsum("bnd,kmd->bknm", unit(features), unit(sets))
    expected = sinkhorn(cost, epsilon=0.1, threshold=0.0, max_iter=200).plan
    np.testing.assert_allclose(plans, expected, atol=1e-6)
    np.testing.assert_allclose(costs, np.sum(expected * cost, axis=(-2, -1)), atol=1e-6)


def test_match_per_sample_sets_and_sqeuclidean_cost():
    features = RNG.normal(size=(2, 3, 3, 4)).astype("float32")
    sets = RNG.normal(size=(2, 5, 4)).astype("float32")
    plans = SinkhornMatch(cost="sqeuclidean", pairing="sample", epsilon=1.0, threshold=1e-6, max_iter=500)(
        [features, sets])
    assert plans.shape == (2, 9, 5)
    np.testing.assert_allclose(np.sum(plans, axis=-1), np.full((2, 9), 1 / 9), atol=1e-5)
    np.testing.assert_allclose(np.sum(plans, axis=-2), np.full((2, 5), 1 / 5), atol=1e-5)


def test_mpw_logits_are_plan_weighted_inner_products():
    layer = MultiProxyWasserstein(3, num_proxies=2, threshold=0.0, max_iter=200)
    features = RNG.normal(size=(2, 2, 2, 4)).astype("float32")
    logits = layer(features).numpy()
    x = features.reshape(2, 4, 4)
    proxies = layer.proxies.numpy()
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    plans = sinkhorn(1.0 - np.einsum("bnd,kmd->bknm", unit(x), unit(proxies)), threshold=0.0, max_iter=200).plan
    expected = np.sum(plans * np.einsum("bnd,kmd->bknm", x, proxies), axis=(-2, -1))
    np.testing.assert_allclose(logits, expected, atol=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"), (dict(max_iter=0), "max_iter"),
    (dict(cost="l1"), "cost"), (dict(pairing="episode"), "pairing"), (dict(p=0), "`p`"),
    (dict(threshold=-0.1), "threshold"),
])
def test_match_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SinkhornMatch(**kwargs)


def test_match_rejects_bad_shapes():
    """A first call's bad inputs raise the message alone, one line (not inside Keras' several-line report of a
    failed call); a later call's too."""
    layer = SinkhornMatch()
    for inputs, message in [([np.zeros((2, 5, 4), "float32"), np.zeros((3, 2, 6), "float32")],
                             "The feature dimension of `features` (4) does not match that of `targets` (6)."),
                            ([np.zeros((2, 4), "float32"), np.zeros((3, 2, 4), "float32")],
                             "`features` must have rank 3 or 4, got shape (2, 4) (rank 2)."),
                            (np.zeros((2, 4), "float32"), "SinkhornMatch expects `inputs=[features, targets]` (a list "
                             "of two tensors), got one tensor of shape (2, 4).")]:
        with pytest.raises(ValueError) as raised:
            layer(inputs)
        assert str(raised.value) == message
    layer([np.zeros((2, 5, 4), "float32"), np.zeros((3, 2, 4), "float32")])
    with pytest.raises(ValueError, match=r"got 3 inputs\."):
        layer([np.zeros((2, 5, 4), "float32")] * 3)
    with pytest.raises(ValueError, match="num_classes"):
        MultiProxyWasserstein(0)
    with pytest.raises(ValueError, match="rank"):
        MultiProxyWasserstein(3)(np.zeros((2, 4), "float32"))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_save_load_roundtrip(name, tmp_path):
    model = BUILDERS[name]()
    keras_checks.assert_save_load_roundtrip(model, X_MAP, tmp_path)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_fit_with_xla(name):
    keras_checks.assert_fits_with_xla(BUILDERS[name], X_MAP, Y, LOSS)


def test_fit_with_xla_unrolled_gradient():
    keras_checks.assert_fits_with_xla(lambda: build_mpw_model("unrolled"), X_MAP, Y, LOSS)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_fit_mirrored(name):
    keras_checks.assert_fits_mirrored(BUILDERS[name], X_MAP, Y, LOSS)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_mixed_float16(name):
    reference = BUILDERS[name]()
    keras_checks.assert_mixed_precision(BUILDERS[name], X_MAP, float32_model=reference)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_export_parity(name, tmp_path):
    keras_checks.assert_export_parity(BUILDERS[name](), X_MAP[:4], tmp_path, atol=1e-5)
