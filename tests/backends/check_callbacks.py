"""The layer-state callbacks in ``model.fit`` on the active Keras backend: Hungarian prototype re-assignment
(``PrototypeReassignment`` with ``HypersphericalPrototypes``), GSP's warm-up and k-center initialization
(``GSPPrototypeInit``) and EDMS hard proxies (``HardProxyUpdate``). Each fit must lower its loss and leave the layer
state the callback promises (a permutation; prototypes that are stored features; unit proxies equal to the
callback's own estimate).

    KERAS_BACKEND=torch python tests/backends/check_callbacks.py
"""
import keras
import numpy as np

import zoo
from backend_tools import Report
from ot_layers import ClassProxies, GeneralizedSumPooling, ManifoldProxies
from ot_layers.callbacks import GSPPrototypeInit, HardProxyUpdate, PrototypeReassignment
from ot_layers.losses import HypersphericalPullLoss, ManifoldProxyLoss, ProxyNCAPlusPlusLoss
from ot_layers.tensor_ops import find_layer
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
report.finish()
