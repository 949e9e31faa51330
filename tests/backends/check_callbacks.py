"""The layer-state callbacks in ``model.fit`` on the active Keras backend: Hungarian prototype re-assignment
(``PrototypeReassignment`` with ``HypersphericalPrototypes``), GSP's warm-up and k-center initialization
(``GSPPrototypeInit``), EDMS hard proxies (``HardProxyUpdate``) and CCP's proxy re-initialization
(``CCPReinitialization``), the last two also with their layer inside a nested model. Each fit must lower its loss
(CCP: re-initialize and restore its best weights) and leave the layer state the callback promises (a permutation;
prototypes that are stored features; unit proxies equal to the callback's own estimate).

    KERAS_BACKEND=torch python tests/backends/check_callbacks.py
"""
import keras
import numpy as np

import zoo
from backend_tools import Report
from ot_layers import ClassProxies, GeneralizedSumPooling, ManifoldProxies
from ot_layers.callbacks import (CCPReinitialization, GSPPrototypeInit, HardProxyUpdate, PrototypeReassignment,
                                 remove_ccp_state)
from ot_layers.losses import HypersphericalPullLoss, ManifoldProxyLoss, ProxyNCAPlusPlusLoss
from ot_layers.tensor_ops import find_layer, layer_input_model
from ot_layers.layers import HypersphericalPrototypes

report = Report("callbacks")
rng = np.random.default_rng(0)
labels = (np.arange(64) % 4).astype(np.int32)
patterns = rng.uniform(0, 255, size=(4, 12, 12, 1))
images = np.clip(patterns[labels] + rng.normal(0, 40, size=(64, 12, 12, 1)), 0, 255).astype(np.float32)


def backbone():
    inputs = keras.Input((12, 12, 1))
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(x))


# Hyperspherical prototypes: the pull loss with the labels as a second input, Hungarian re-assignment each epoch.
keras.utils.set_random_seed(0)
classifier = zoo.image_classifier(backbone(), "hyperspherical", 4, input_shape=(12, 12, 1), head_kwargs={"dim": 3})
training = zoo.hyperspherical_training_model(classifier)
training.compile(keras.optimizers.SGD(0.05, momentum=0.9), HypersphericalPullLoss())
history = training.fit([images, labels], labels, epochs=3, batch_size=16, verbose=0,
                       callbacks=[PrototypeReassignment()])
losses = history.history["loss"]
report.expect("hyperspherical_loss_decreases", np.isfinite(losses).all() and losses[-1] < losses[0], str(losses))
head = find_layer(classifier, HypersphericalPrototypes)
assignment = np.asarray(keras.ops.convert_to_numpy(head.assignment)).astype(int)
report.expect("hyperspherical_assignment_is_a_permutation", sorted(assignment.tolist()) == list(range(4)),
              str(assignment))

# GSP: average-pooling warm-up for one epoch, then prototypes by k-center on stored features.
keras.utils.set_random_seed(0)
inputs = keras.Input((12, 12, 1))
features = backbone()(inputs)
pooled = GeneralizedSumPooling(num_prototypes=5, epsilon=2.0, max_iter=20, name="gsp")(features)
model = keras.Model(inputs, ClassProxies(4, name="proxies")(keras.layers.Dense(8)(pooled)))
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=ProxyNCAPlusPlusLoss())
init = GSPPrototypeInit(images, layer_name="gsp", warmup_epochs=1, num_features=200)
history = model.fit(images, labels, epochs=3, batch_size=16, verbose=0, callbacks=[init])
losses = history.history["loss"]
report.expect("gsp_loss_decreases", np.isfinite(losses).all() and losses[-1] < losses[0], str(losses))
report.expect("gsp_initialized", bool(init.initialized))
prototypes = np.asarray(keras.ops.convert_to_numpy(model.get_layer("gsp").prototypes))
report.expect("gsp_prototypes_finite_and_distinct", np.isfinite(prototypes).all()
              and np.unique(prototypes.round(6), axis=0).shape[0] == 5)

# EDMS: hard proxies re-estimated every epoch.
keras.utils.set_random_seed(0)
x = (rng.standard_normal((48, 10)) + 2.0 * np.eye(3, 10)[labels[:48] % 3]).astype(np.float32)
y = (labels[:48] % 3).astype(np.int32)
inputs = keras.Input((10,))
embedding = keras.layers.Dense(6, name="embed")(inputs)
model = keras.Model(inputs, ManifoldProxies(3, 6, mode="contextual", name="head")(embedding))
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=ManifoldProxyLoss())
callback = HardProxyUpdate(keras.Model(inputs, embedding), x, y, max_iter=20, learning_rate=0.1,
                           samples_per_meta_class=8)
history = model.fit(x, y, epochs=3, batch_size=16, verbose=0, callbacks=[callback])
losses = history.history["loss"]
report.expect("hard_proxies_loss_decreases", np.isfinite(losses).all() and losses[-1] < losses[0], str(losses))
proxies = np.asarray(keras.ops.convert_to_numpy(model.get_layer("head").proxies))
report.measure("hard_proxies_unit_norm", np.abs(np.linalg.norm(proxies, axis=1) - 1.0).max(), 1e-5)

# CCP: a validation score that only falls re-initializes the proxies after every epoch past the first; the best
# weights (the first epoch's) come back at the end. On JAX this failed at the second epoch ("Attempt to donate the
# same buffer twice": the state's copy of a weight shared its buffer). The proxies sit in a nested model.
keras.utils.set_random_seed(0)
vectors = (rng.standard_normal((32, 6)) + 2.0 * np.eye(4, 6)[labels[:32]]).astype(np.float32)
inner_inputs = keras.Input((6,))
inner = keras.Model(inner_inputs, ClassProxies(4, num_proxies=2, name="proxies")(keras.layers.Dense(5)(inner_inputs)))
inputs = keras.Input((6,))
model = keras.Model(inputs, inner(inputs))
model.compile(optimizer=keras.optimizers.SGD(0.1), loss=ProxyNCAPlusPlusLoss())
epoch_weights = []
record = keras.callbacks.LambdaCallback(  # before CCP's own epoch end: the weights each score is given for
    on_epoch_end=lambda epoch, logs: epoch_weights.append([np.array(keras.ops.convert_to_numpy(w))
                                                          for w in inner.weights]))
scores = iter([0.9, 0.5, 0.4])
ccp = CCPReinitialization(vectors, labels[:32], lambda: next(scores), patience=1, pool_size=4)
history = model.fit(vectors, labels[:32], epochs=3, batch_size=16, verbose=0, callbacks=[record, ccp])
report.expect("ccp_reinitializes", ccp.reinitializations == 1, str(ccp.reinitializations))  # after epoch 1
report.expect("ccp_losses_finite", np.isfinite(history.history["loss"]).all(), str(history.history["loss"]))
restored = [np.array(keras.ops.convert_to_numpy(w)) for w in inner.weights]
report.measure("ccp_restores_best_weights", max(np.abs(a - b).max() for a, b in zip(restored, epoch_weights[0])),
               0.0)
# without its state the model's weights are the architecture's own again (set_weights into a twin works)
remove_ccp_state(model)
twin = keras.models.clone_model(model)
twin.set_weights(model.get_weights())
report.measure("ccp_state_removed_twin_predicts_alike",
               float(np.abs(twin.predict(vectors, verbose=0) - model.predict(vectors, verbose=0)).max()), 0.0)

# GSP initialization in a nested embedding model (its features read through the outer model's graph; this
# failed with "Output ... is not connected to inputs" on every backend)
keras.utils.set_random_seed(0)
inner_inputs = keras.Input((12, 12, 1))
pooled = GeneralizedSumPooling(num_prototypes=5, epsilon=2.0, max_iter=20, name="gsp")(backbone()(inner_inputs))
embedder = keras.Model(inner_inputs, keras.layers.Dense(8)(pooled), name="embedder")
inputs = keras.Input((12, 12, 1))
model = keras.Model(inputs, ClassProxies(4, name="proxies")(embedder(inputs)))
model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=ProxyNCAPlusPlusLoss())
init = GSPPrototypeInit(images, warmup_epochs=1, num_features=200)
model.fit(images, labels, epochs=2, batch_size=16, verbose=0, callbacks=[init])
report.expect("gsp_nested_initialized", bool(init.initialized))
prototypes = np.asarray(keras.ops.convert_to_numpy(embedder.get_layer("gsp").prototypes))
report.expect("gsp_nested_prototypes_finite_and_distinct", np.isfinite(prototypes).all()
              and np.unique(prototypes.round(6), axis=0).shape[0] == 5)
# the features the callback read: the nested layer's input, reached from the outer model's input
seen = layer_input_model(model, embedder.get_layer("gsp")).predict(images, verbose=0)
direct = keras.Model(inner_inputs, embedder.get_layer("gsp").input).predict(images, verbose=0)
report.measure("nested_layer_input_vs_direct", float(np.abs(seen - direct).max()), 1e-6)
report.finish()
