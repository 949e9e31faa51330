"""The layer-state callbacks' arguments and misuse, checked before training work is spent or state is lost:
a hyperspherical model that never feeds labels to its layer (the re-assignment silently never happened), a model
without the layer (found after the first epoch), NaN or Inf images (a backbone may turn them into a finite
constant: every proxy or prototype the same), CCP's state made under other settings (silently reset), its
penalty left on the weights by ``evaluate`` or ``predict``, a class with fewer images than its proxies, a
``validation_score`` that returns no number, GSP's ``num_features`` below its prototypes, and images that do not
fit the model (or an embedding model whose vectors do not fit the layer), which Keras refused only epochs later
(CCP at its first plateau, GSP after the warm-up) in an input-spec or ``assign`` error naming an internal model."""
import re

import keras
import numpy as np
import pytest

import zoo
from ot_layers import ClassProxies, GeneralizedSumPooling, ManifoldProxies
from ot_layers.callbacks import CCPReinitialization, GSPPrototypeInit, HardProxyUpdate, PrototypeReassignment
from ot_layers.losses import HypersphericalPullLoss, ManifoldProxyLoss, ProxyAnchorLoss
from ot_layers.validation import check_fits_model_inputs

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


# ---- images that do not fit the model: refused when the model is known, before any epoch -------------------------

def _fit_refuses_before_any_step(model, x, y, callback, message):
    """``fit`` with ``callback`` raises a ``ValueError`` matching ``message`` before its first training step."""
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: steps.append(batch))
    with pytest.raises(ValueError, match=message):
        model.fit(x, y, epochs=2, batch_size=4, verbose=0, callbacks=[callback, counter])
    assert steps == []


def test_ccp_train_images_that_do_not_fit_the_model_are_named_when_it_is_set():
    """(10, 5) images for a (None, 6) model passed until the first plateau's re-initialization, epochs in."""
    model = _proxy_model()
    wrong = VECTORS[:, :5]
    with pytest.raises(ValueError, match=r"^`train_images`: the model takes inputs of shape \(None, 6\), "
                                         r"got shape \(12, 5\)\.$"):
        CCPReinitialization(wrong, LABELS, lambda: 0.0).set_model(model)
    assert not hasattr(model, "ccp_state")  # refused before the state is attached
    _fit_refuses_before_any_step(model, VECTORS, LABELS, CCPReinitialization(wrong, LABELS, lambda: 0.0),
                                 "^`train_images`: the model takes inputs")
    embed = keras.Model(model.inputs, model.get_layer("proxies").input)
    with pytest.raises(ValueError, match=r"^`train_images`: the embedding model takes inputs of shape \(None, 6\), "
                                         r"got shape \(12, 5\)"):
        CCPReinitialization(wrong, LABELS, lambda: 0.0, embedding_model=embed)
    CCPReinitialization(VECTORS, LABELS, lambda: 0.0, embedding_model=embed).set_model(model)


class SubclassedEmbedding(keras.Model):
    """An embedding model whose output shape is unknown until it runs."""

    def __init__(self, width):
        super().__init__()
        self.dense = keras.layers.Dense(width)

    def call(self, x):
        return self.dense(x)


def test_ccp_embedding_model_of_another_width_than_the_proxies_is_named_before_any_step():
    """An embedding model of width 5 for proxies of width 4 passed until the first plateau, epochs in, where the
    k-center re-initialization failed in a matrix product that named neither; a subclassed model's width is known
    once it has run: it embeds one image when training begins, still before any step."""
    model = _proxy_model()
    wrong = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5)])
    message = (r"^`embedding_model` gives embeddings of shape \(None, 5\), but the ClassProxies layer 'proxies' "
               r"\(the width of its proxies\) takes vectors of shape \(None, 4\)\.$")
    with pytest.raises(ValueError, match=message):
        CCPReinitialization(VECTORS, LABELS, lambda: 0.0, embedding_model=wrong).set_model(model)
    _fit_refuses_before_any_step(model, VECTORS, LABELS,
                                 CCPReinitialization(VECTORS, LABELS, lambda: 0.0, embedding_model=wrong), message)
    def ccp(embedding_model):
        return CCPReinitialization(VECTORS, LABELS, lambda: 0.0, embedding_model=embedding_model)

    _fit_refuses_before_any_step(model, VECTORS, LABELS, ccp(SubclassedEmbedding(5)), message)
    model.fit(VECTORS, LABELS, epochs=1, batch_size=4, verbose=0, callbacks=[ccp(SubclassedEmbedding(4))])


def test_ccp_on_proxies_of_another_space_than_the_layer_input_asks_for_an_embedding_model():
    """``output="packed"`` proxies of width 4 on 5-wide inputs: without an embedding model the pools are the layer's
    inputs, and the first re-initialization failed in the k-center solver with a shape error naming `initial`."""
    inputs = keras.Input((6,))
    model = keras.Model(inputs, ClassProxies(3, num_proxies=1, dim=4, output="packed", name="proxies")(
        keras.layers.Dense(5)(inputs)))
    with pytest.raises(ValueError, match=r"^`embedding_model`: the ClassProxies layer 'proxies' takes vectors of "
                                         r"width 5 and its proxies have width 4; .* give an `embedding_model`"):
        CCPReinitialization(VECTORS, LABELS, lambda: 0.0).set_model(model)


def test_ccp_train_images_for_a_model_of_several_inputs_are_named():
    """The pools go through ``keras.Model(model.inputs, layer.input)``: one array cannot feed two inputs."""
    vectors, extra = keras.Input((6,)), keras.Input((2,))
    proxies = ClassProxies(3, num_proxies=2, name="proxies")(keras.layers.Dense(4)(vectors))
    model = keras.Model([vectors, extra], proxies)
    with pytest.raises(ValueError, match=r"^`train_images`: the model takes 2 inputs, of shapes \(None, 6\), "
                                         r"\(None, 2\), got one array of shape \(12, 6\)"):
        CCPReinitialization(VECTORS, LABELS, lambda: 0.0).set_model(model)
    embed = keras.Model(vectors, model.get_layer("proxies").input)  # the way out: an embedding model of the images
    CCPReinitialization(VECTORS, LABELS, lambda: 0.0, embedding_model=embed).set_model(model)


def _gsp_model():
    inputs = keras.Input((6, 6, 3))
    pooled = GeneralizedSumPooling(num_prototypes=2, name="gsp")(keras.layers.Conv2D(4, 1)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2)(pooled))
    model.compile("sgd", "sparse_categorical_crossentropy")
    return model


@pytest.mark.parametrize("shape", [(4, 5, 5, 3), (4, 6, 6, 1), (4, 108)])
def test_gsp_images_that_do_not_fit_the_model_are_named_when_training_begins(shape):
    """Wrong spatial size or channels passed through the warm-up and failed in ``initialize_prototypes``."""
    model = _gsp_model()
    callback = GSPPrototypeInit(RNG.uniform(size=shape), warmup_epochs=1)
    message = (r"^`images`: the model takes inputs of shape \(None, 6, 6, 3\), got shape "
               + re.escape(str(shape)) + r"\.$")
    _fit_refuses_before_any_step(model, RNG.uniform(size=(8, 6, 6, 3)), np.arange(8) % 2, callback, message)
    assert float(model.get_layer("gsp").warmup_epochs_done.numpy()) == 0.0


def _edms_model(dim=4):
    inputs = keras.Input((6,))
    embedded = keras.layers.Dense(dim, name="embed")(inputs)
    model = keras.Model(inputs, ManifoldProxies(3, dim, name="head")(embedded))
    model.compile("adam", ManifoldProxyLoss())
    return model


def test_hard_proxy_images_that_do_not_fit_the_embedding_model_are_named_when_it_is_made():
    embed = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)])
    with pytest.raises(ValueError, match=r"^`images`: the embedding model takes inputs of shape \(None, 6\), "
                                         r"got shape \(12, 5\)\.$"):
        HardProxyUpdate(embed, VECTORS[:, :5], LABELS)
    HardProxyUpdate(embed, VECTORS, LABELS)


def test_hard_proxy_embeddings_of_another_size_than_the_layer_are_named_before_the_first_epoch():
    """A (None, 5) embedding model for a layer of dim=4 failed in the first epoch's ``proxies.assign`` with a
    multi-line shape error that printed the proxies."""
    model = _edms_model()
    wrong = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5)])
    callback = HardProxyUpdate(wrong, VECTORS, LABELS)
    callback.set_model(model)
    message = (r"^`embedding_model` gives embeddings of shape \(None, 5\), but the ManifoldProxies layer 'head' "
               r"\(its `dim`\) takes vectors of shape \(None, 4\)\.$")
    with pytest.raises(ValueError, match=message):
        callback.on_train_begin()
    _fit_refuses_before_any_step(model, VECTORS, LABELS, HardProxyUpdate(wrong, VECTORS, LABELS), message)


def test_hard_proxy_embeddings_of_a_subclassed_model_are_checked_once_computed():
    """A subclassed embedding model has no static output shape: its embeddings are checked at the first epoch's
    start, still before any step, with the same one line."""

    _fit_refuses_before_any_step(_edms_model(), VECTORS, LABELS,
                                 HardProxyUpdate(SubclassedEmbedding(5), VECTORS, LABELS),
                                 r"^`embedding_model` gives embeddings of shape \(None, 5\), but the ManifoldProxies "
                                 r"layer 'head'")


def test_the_shape_check_follows_keras():
    """``None`` dims match anything and a trailing axis of size 1 may be missing or extra (Keras adjusts it); a
    model whose inputs are unknown passes (Keras checks when it runs); lists go input by input."""
    inputs = keras.Input((None, None, 1))
    images = keras.Model(inputs, keras.layers.Identity()(inputs))
    for shape in [(2, 9, 7, 1), (2, 9, 7)]:
        check_fits_model_inputs("x", np.zeros(shape), images)
    with pytest.raises(ValueError, match=r"^`x`: the model takes inputs of shape \(None, None, None, 1\)"):
        check_fits_model_inputs("x", np.zeros((2, 9, 7, 3)), images)
    vector = keras.Input((4,))
    check_fits_model_inputs("x", np.zeros((2, 4, 1)), keras.Model(vector, keras.layers.Identity()(vector)))
    check_fits_model_inputs("x", np.zeros((2, 3)), keras.Sequential([keras.layers.Dense(2)]))  # inputs unknown
    a, b = keras.Input((4,)), keras.Input(())
    pair = keras.Model([a, b], keras.layers.Dense(1)(a))
    check_fits_model_inputs("x", [np.zeros((2, 4)), np.zeros(2)], pair)
    check_fits_model_inputs("x", np.zeros((2, 4)), pair, first_input_only=True)
    with pytest.raises(ValueError, match=r"^`x` part 1: input 1 of the model takes batches of shape \(None,\), "
                                         r"got shape \(2, 3\)\.$"):
        check_fits_model_inputs("x", [np.zeros((2, 4)), np.zeros((2, 3))], pair)
    with pytest.raises(ValueError, match=r"^`x`: input 0 of the model takes inputs of shape \(None, 4\)"):
        check_fits_model_inputs("x", np.zeros((2, 5)), pair, first_input_only=True)
    with pytest.raises(ValueError, match=r"^`x`: the model takes 2 input\(s\), got a list of 1 arrays\.$"):
        check_fits_model_inputs("x", [np.zeros((2, 4))], pair)
