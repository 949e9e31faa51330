"""The layer-state callbacks' arguments and misuse, checked before training work is spent or state is lost:
a hyperspherical model that never feeds labels to its layer (the re-assignment silently never happened), a model
without the layer (found after the first epoch), NaN or Inf images (a backbone may turn them into a finite
constant: every proxy or prototype the same), CCP's state made under other settings (silently reset), its
penalty left on the weights by ``evaluate`` or ``predict``, a class with fewer images than its proxies, a
``validation_score`` that returns no number, and GSP's ``num_features`` below its prototypes."""
import keras
import numpy as np
import pytest

import zoo
from ot_layers import ClassProxies
from ot_layers.callbacks import CCPReinitialization, GSPPrototypeInit, HardProxyUpdate, PrototypeReassignment
from ot_layers.losses import HypersphericalPullLoss, ProxyAnchorLoss

RNG = np.random.default_rng(0)
IMAGES = RNG.uniform(0, 255, size=(12, 8, 8, 1)).astype(np.float32)
LABELS = np.arange(12) % 3
VECTORS = RNG.normal(size=(12, 6)).astype(np.float32)


def _backbone():
    return zoo.backbone("small_convnet", input_shape=(8, 8, 1), width=4, feature_dim=8)


def _hyperspherical():
    return zoo.image_classifier(_backbone(), "hyperspherical", 3, head_kwargs={"dim": 4})


def test_reassignment_on_a_model_that_feeds_no_labels_is_refused():
    """The inference model's layer never receives labels, so its representatives stay zero and the Hungarian step
    had nothing to work on: the run looked like DL2PA without its re-assignment."""
    model = _hyperspherical()
    model.compile("adam", HypersphericalPullLoss())
    with pytest.raises(ValueError, match="has received no labels .*zoo.hyperspherical_training_model"):
        model.fit(IMAGES, LABELS, epochs=1, verbose=0, callbacks=[PrototypeReassignment()])
    trained = zoo.hyperspherical_training_model(_hyperspherical())
    trained.compile("adam", HypersphericalPullLoss())
    callback = PrototypeReassignment()
    trained.fit([IMAGES, LABELS], LABELS, epochs=1, verbose=0, callbacks=[callback])
    assert len(callback.changes) == 1


def test_reassignment_without_its_layer_fails_before_training():
    model = zoo.image_classifier(_backbone(), "gap_fc", 3)
    callback = PrototypeReassignment()
    callback.set_model(model)
    with pytest.raises(ValueError, match="HypersphericalPrototypes"):
        callback.on_train_begin()
    with pytest.raises(ValueError, match="^`verbose`"):
        PrototypeReassignment(verbose="yes")


def _proxy_model():
    inputs = keras.Input((6,))
    model = keras.Model(inputs, ClassProxies(3, num_proxies=2, name="proxies")(keras.layers.Dense(4)(inputs)))
    model.compile(keras.optimizers.SGD(0.01), ProxyAnchorLoss())
    return model


@pytest.mark.parametrize("build, message", [
    (lambda: CCPReinitialization(np.where(VECTORS > 1, np.nan, VECTORS), LABELS, lambda: 0.0),
     "^`train_images` holds NaN or Inf"),
    (lambda: CCPReinitialization(None, LABELS, lambda: 0.0), "^`train_images` must be an array"),
    (lambda: CCPReinitialization(VECTORS, LABELS, lambda: 0.0, embedding_model="abc"), "^`embedding_model`"),
    (lambda: HardProxyUpdate(None, np.full((4, 6), np.inf), np.array([0, 0, 1, 1])), "^`images` holds NaN"),
    (lambda: HardProxyUpdate(None, VECTORS, LABELS), "^`embedding_model` must be a Keras model"),
    (lambda: GSPPrototypeInit(None), "^`images` must be an array"),
    (lambda: GSPPrototypeInit(IMAGES[:0]), "^`images` must be a non-empty array"),
])
def test_callback_inputs_are_named_when_the_callback_is_made(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_ccp_checks_its_classes_and_keeps_a_state_it_cannot_resume():
    model = _proxy_model()
    labels = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2])  # class 2: one image for two proxies
    with pytest.raises(ValueError, match="^`train_labels`: class 2 has 1 training image"):
        CCPReinitialization(VECTORS, labels, lambda: 0.0).set_model(model)
    CCPReinitialization(VECTORS, LABELS, lambda: 0.0).set_model(model)
    state = model.ccp_state
    state.reinitializations.assign(2.0)
    with pytest.raises(ValueError, match="restore_best_weights.*delete `model.ccp_state`"):
        CCPReinitialization(VECTORS, LABELS, lambda: 0.0, restore_best_weights=False).set_model(model)
    assert model.ccp_state is state and float(state.reinitializations.numpy()) == 2.0


def test_ccp_penalty_is_on_in_fit_only():
    """``evaluate`` and ``predict`` call ``set_model`` but not ``on_train_end``: the penalty set there stayed on
    the weights and counted in every later loss."""
    model = _proxy_model()
    ccp = CCPReinitialization(VECTORS, LABELS, lambda: 0.0, proximal=1e3)
    model.evaluate(VECTORS, LABELS, verbose=0, callbacks=[ccp])
    model.predict(VECTORS, verbose=0, callbacks=[ccp])
    assert not model.losses
    model.ccp_state.proximal_active.assign(1.0)
    seen = []
    probe = keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: seen.append(len(model.losses)))
    model.fit(VECTORS, LABELS, epochs=1, verbose=0, callbacks=[ccp, probe])
    assert seen == [2] and not model.losses  # the Dense kernel and bias are pulled during fit, freed after it


@pytest.mark.parametrize("score", [lambda: {"map_at_r": 0.5}, lambda: None, lambda: "0.5"])
def test_ccp_validation_score_that_returns_no_number_is_named(score):
    model = _proxy_model()
    with pytest.raises(ValueError, match="^`validation_score` must return a float"):
        model.fit(VECTORS, LABELS, epochs=1, verbose=0, callbacks=[CCPReinitialization(VECTORS, LABELS, score)])


def test_gsp_init_with_fewer_features_than_prototypes_fails_before_training():
    from ot_layers import GeneralizedSumPooling
    inputs = keras.Input((6, 6, 3))
    pooled = GeneralizedSumPooling(num_prototypes=5, name="gsp")(keras.layers.Conv2D(8, 1)(inputs))
    model = keras.Model(inputs, pooled)
    callback = GSPPrototypeInit(RNG.uniform(size=(4, 6, 6, 3)), num_features=2)
    callback.set_model(model)
    with pytest.raises(ValueError, match=r"^`num_features` \(2\) must be at least the layer's 5 prototypes"):
        callback.on_train_begin()


def test_ccp_takes_a_scalar_tensor_as_validation_score_and_reassignment_a_boolean_verbose():
    model = _proxy_model()
    ccp = CCPReinitialization(VECTORS, LABELS, lambda: keras.ops.convert_to_tensor(0.25))
    model.fit(VECTORS, LABELS, epochs=1, verbose=0, callbacks=[ccp])
    assert ccp.history == [0.25]
    assert PrototypeReassignment(verbose=True).verbose == 1


def test_gsp_init_warns_when_the_fit_ends_inside_the_warm_up():
    """With as many warm-up epochs left as the fit runs, the layer would pool like GAP to the end and its prototypes
    would never train: ``fit`` says so when it begins; a fit that outlasts the warm-up says nothing."""
    import warnings

    from ot_layers import GeneralizedSumPooling

    def fit(epochs):
        inputs = keras.Input((6, 6, 3))
        pooled = GeneralizedSumPooling(num_prototypes=2, name="gsp")(keras.layers.Conv2D(4, 1)(inputs))
        model = keras.Model(inputs, keras.layers.Dense(2)(pooled))
        model.compile("sgd", "sparse_categorical_crossentropy")
        images, labels = RNG.uniform(size=(8, 6, 6, 3)), np.arange(8) % 2
        model.fit(images, labels, epochs=epochs, verbose=0, callbacks=[GSPPrototypeInit(images, warmup_epochs=2)])

    with pytest.warns(UserWarning, match="2 warm-up epoch.* runs 2, so layer 'gsp' pools like global average"):
        fit(epochs=2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="GSPPrototypeInit")
        fit(epochs=3)
