"""The layer-state callbacks on models that Keras builds only at their first training step (a ``Sequential`` without
an ``Input``, a subclassed model): ``fit`` hands them such a model before its layers have weights, and
``CCPReinitialization`` / ``HardProxyUpdate`` stopped it there with a bare ``AttributeError`` ('ClassProxies' object
has no attribute 'proxies'). They now run as on the same model built beforehand."""
import keras
import numpy as np
import pytest

from ot_layers import ClassProxies, ManifoldProxies
from ot_layers.callbacks import CCPReinitialization, HardProxyUpdate
from ot_layers.losses import ManifoldProxyLoss, ProxyAnchorLoss

C, P, DIM, IN = 3, 2, 4, 6
RNG = np.random.default_rng(0)
Y = (np.arange(60) % C).astype(np.int32)
X = (RNG.standard_normal((60, IN)) + 3.0 * np.eye(C, IN)[Y]).astype(np.float32)
SCORES = [0.5, 0.4, 0.3, 0.6, 0.2, 0.1]  # patience 2: re-initializations after epochs 3 and 6


class ProxyNet(keras.Model):
    def __init__(self, head):
        super().__init__(name="net")
        self.embed = keras.layers.Dense(DIM, name="embed")
        self.head = head

    def call(self, x):
        return self.head(self.embed(x))


def _proxy_model(kind):
    """The model and the layer that embeds its inputs, freshly seeded (the same initial weights every time)."""
    keras.utils.set_random_seed(0)
    head = ClassProxies(C, num_proxies=P, name="proxies")
    if kind == "sequential":
        model = keras.Sequential([keras.layers.Dense(DIM, name="embed"), head], name="net")
        embed = model.layers[0]
    else:
        model = ProxyNet(head)
        embed = model.embed
    model.compile(keras.optimizers.Adam(1e-2), ProxyAnchorLoss())
    return model, embed


def _own_weights(model):
    state = {id(v) for v in model.ccp_state.weights}
    return [np.asarray(w) for w in model.weights if id(w) not in state]


def _fit_ccp(kind, build_first, with_embedding_model):
    model, embed = _proxy_model(kind)
    if build_first:
        model(X[:1])
    feed = iter(SCORES)
    embedding_model = keras.Sequential([embed]) if with_embedding_model else None
    ccp = CCPReinitialization(X, Y, validation_score=lambda: next(feed), patience=2, pool_size=4, proximal=0.5,
                              embedding_model=embedding_model)
    history = model.fit(X, Y, epochs=len(SCORES), batch_size=20, verbose=0, shuffle=False, callbacks=[ccp])
    return model, ccp, history


@pytest.mark.parametrize("kind, with_embedding_model", [("sequential", True), ("sequential", False),
                                                        ("subclassed", True)])
def test_ccp_on_a_model_built_at_its_first_step_runs_as_on_a_built_one(kind, with_embedding_model):
    built, built_ccp, _ = _fit_ccp(kind, True, with_embedding_model)
    model, ccp, history = _fit_ccp(kind, False, with_embedding_model)
    assert history.history["val_score"] == pytest.approx(SCORES)
    assert ccp.reinitializations == built_ccp.reinitializations == 2
    assert not model.losses  # the proximal penalty (on after the first re-initialization) is off again
    for got, want in zip(_own_weights(model), _own_weights(built)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for got, want in zip(model.ccp_state.weights, built.ccp_state.weights):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_ccp_without_embedding_model_on_a_subclassed_model_is_refused_before_training():
    """A subclassed model has no graph to read the layer's inputs from: CCP failed at the first re-initialization,
    epochs in, inside Keras."""
    model, _ = _proxy_model("subclassed")
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    ccp = CCPReinitialization(X, Y, validation_score=lambda: 0.5, patience=1, pool_size=4)
    with pytest.raises(ValueError, match=r"^`embedding_model`: without it CCP embeds `train_images` through the "
                                         r"functional graph of model 'net' .* pass an `embedding_model`"):
        model.fit(X, Y, epochs=2, batch_size=20, verbose=0, callbacks=[ccp, counter])
    assert steps == [] and not hasattr(model, "ccp_state")


def _fit_hard_proxies(build_first):
    keras.utils.set_random_seed(0)
    embed = keras.layers.Dense(DIM, name="embed")
    model = keras.Sequential([embed, ManifoldProxies(C, DIM, name="head")])
    model.compile(keras.optimizers.Adam(1e-2), ManifoldProxyLoss())
    if build_first:
        model.build((None, IN))
    seen = []
    callback = HardProxyUpdate(keras.Sequential([keras.Input((IN,)), embed]), X, Y)
    record = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: seen.append(np.asarray(model.get_layer("head").proxies)))
    model.fit(X, Y, epochs=2, batch_size=20, verbose=0, shuffle=False, callbacks=[callback, record])
    return model, seen


def test_hard_proxy_update_on_a_model_built_at_its_first_step_runs_as_on_a_built_one():
    built, built_seen = _fit_hard_proxies(True)
    model, seen = _fit_hard_proxies(False)
    for got, want in zip(seen, built_seen):  # the proxies each epoch starts from, the first epoch's included
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(seen[0], axis=1), 1.0, atol=1e-5)  # set by the callback
    for got, want in zip(model.get_weights(), built.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
