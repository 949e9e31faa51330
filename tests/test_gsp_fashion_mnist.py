"""A real (small) training run: GSP + ProxyNCA++ on Fashion-MNIST classes 0-4, retrieval on unseen classes 5-9."""
import keras
import numpy as np
import pytest

import zoo
from ot_layers import ClassProxies, GeneralizedSumPooling
from ot_layers.callbacks import GSPPrototypeInit
from ot_layers.losses import ProxyNCAPlusPlusLoss
from training.data.fashion_mnist import load_fashion_mnist
from training.data.splits import select_classes
from training.evaluation.retrieval import retrieval_metrics
from training.data.samplers import ClassBalancedBatches


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.fashion_mnist
def test_gsp_trains_and_retrieves_unseen_classes():
    x, y = load_fashion_mnist("train", limit=6000)
    x_train, y_train = select_classes(x, y, range(5))
    x, y = load_fashion_mnist("test", limit=2000)
    x_test, y_test = select_classes(x, y, range(5, 10))
    backbone = zoo.small_convnet((28, 28, 1), width=16, feature_dim=32, bn_momentum=0.9)
    local = keras.layers.Conv2D(64, 1)(backbone.output)
    pooled = GeneralizedSumPooling(num_prototypes=16, epsilon=2.0, max_iter=50, name="gsp")(local)
    model = keras.Model(backbone.input, ClassProxies(5, name="proxies")(pooled))
    embedding_model = keras.Model(backbone.input, pooled)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=ProxyNCAPlusPlusLoss())
    batches = ClassBalancedBatches(x_train, y_train, 5, 16, steps_per_epoch=len(x_train) // 80, seed=0)
    init = GSPPrototypeInit(x_train[:128], layer_name="gsp", warmup_epochs=1, num_features=512)
    history = model.fit(batches, epochs=3, verbose=0, callbacks=[init])
    losses = history.history["loss"]
    assert init.initialized and np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    seen = retrieval_metrics(embedding_model.predict(x_train[:1000], verbose=0), y_train[:1000], nmi=False)
    unseen = retrieval_metrics(embedding_model.predict(x_test, verbose=0), y_test, nmi=False)
    assert seen["precision_at_1"] > 0.8 and seen["map_at_r"] > 0.4, seen
    assert unseen["precision_at_1"] > 0.7, unseen  # chance is about 0.2
