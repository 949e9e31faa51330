"""The retrieval presets' recipe: train on the seen classes with a proxy loss, evaluate on the unseen ones.

Thesis 003, ch. 5 protocol on Fashion-MNIST: the embedding model (``zoo.embedding_model``: backbone, GAP or GSP
pooling, Dense, L2 normalization) is trained with ProxyNCA++ on ``ClassProxies`` (``zoo.proxy_training_model``) on the
training images of classes 0-4, and evaluated by cosine retrieval among the test images of classes 5-9 (every image a
query against all others): MAP@R, P@1 and R@k (``training.evaluation.retrieval_metrics``). Both poolings share the
recipe (optimizer, schedule, budget, data order, augmentation); GSP adds its GAP warm-up epoch and k-center
prototype initialization (``GSPPrototypeInit``).
"""
import os
import time

import keras

from ot_layers.callbacks import GSPPrototypeInit
from ot_layers.callbacks.layer_signals import LayerSignals
from ot_layers.losses import ProxyNCAPlusPlusLoss
from training.data.fashion_mnist import fashion_mnist_split
from training.data.pipelines import image_dataset
from training.distributed.fit import fit
from training.evaluation.retrieval import retrieval_metrics
from training.recipes.common import (
    preset_recipe,
    reproducing_command,
    run_options,
    sgd_cosine,
    standard_callbacks,
    write_preset,
)
from zoo.loading import build, load, model_card
from zoo.registry import PRESETS
from zoo.tasks import proxy_training_model

# The card's metrics (NMI is left out: k-means makes it depend on its own seed and sklearn's version).
RETRIEVAL_METRICS = ("map_at_r", "precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8")


def retrieval_scores(model, images, labels, batch_size=256):
    """The card's retrieval metrics of ``model``'s embeddings of ``images`` (raw pixels), rounded to 4 decimals."""
    embeddings = model.predict(image_dataset(images, labels, batch_size), verbose=0)
    scores = retrieval_metrics(embeddings, labels, metric="cosine", nmi=False)
    return {key: round(scores[key], 4) for key in RETRIEVAL_METRICS}


def retrieval_training(name, model, recipe, num_classes=None):
    """``(the model fit trains, its loss)`` for retrieval preset ``name``'s embedding ``model``: fresh
    ``ClassProxies`` for the seen classes (``num_classes``, default the preset's) and ProxyNCA++ at the recipe's
    temperature."""
    num_classes = num_classes or len(PRESETS[name]["train_classes"])
    trained = proxy_training_model(model, num_classes, recipe["num_proxies"])
    return trained, ProxyNCAPlusPlusLoss(temperature=recipe["temperature"])


def fit_embedding(name, images, labels, recipe, strategy, overrides=None, callbacks=(), verbose=2):
    """Build retrieval preset ``name``'s embedding model (``overrides``: ``zoo.build``'s, e.g. ``epsilon=0.2`` for
    the GSP pooling) under ``strategy`` and train it by ``recipe`` with ProxyNCA++ on ``images`` (raw pixels) and
    ``labels`` (``0..C-1``; one proxy set per class present). GSP gets its GAP warm-up and k-center initialization.
    ``callbacks`` follow the layer's own (``BackupAndRestore`` among them resumes a run). Returns ``(model, seconds
    of training)``."""

    if len(images) < recipe["batch_size"]:
        raise ValueError(f"`limit`: {len(images)} training images of the seen classes, fewer than one batch of "
                         f"{recipe['batch_size']}.")
    keras.utils.set_random_seed(recipe["seed"])
    steps = len(images) // recipe["batch_size"]
    with strategy.scope():
        model = build(name, l2=recipe["l2"], **(overrides or {}))
        trained, loss = retrieval_training(name, model, recipe, num_classes=int(labels.max()) + 1)
        trained.compile(optimizer=sgd_cosine(recipe, steps * recipe["epochs"]), loss=loss,
                        jit_compile=recipe["jit_compile"])
    layer_callbacks = []
    if PRESETS[name]["pooling"] == "gsp":  # before BackupAndRestore, so an epoch's backup holds its initialization
        layer_callbacks.append(GSPPrototypeInit(images[:256].astype("float32"), layer_name="gsp", seed=recipe["seed"]))
    train = image_dataset(images, labels, recipe["batch_size"], training=True, pad=recipe["pad"], seed=recipe["seed"])
    start = time.time()
    fit(trained, train, epochs=recipe["epochs"], verbose=verbose, callbacks=layer_callbacks + list(callbacks))
    return model, time.time() - start


def train_retrieval_preset(name, out_dir, epochs=None, batch_size=None, limit=None, seed=None, verbose=2,
                           strategy="auto", config=None, tensorboard=None):
    """Train retrieval preset ``name`` by its recipe; returns the card (also in ``out_dir/metadata.json``).

    ``epochs``, ``batch_size``, ``seed`` override the recipe's; ``limit`` reads only the first ``limit`` training
    images (before keeping the seen classes); ``strategy``, ``config``, ``tensorboard``: see
    ``training.recipes.run_options``.
    """
    strategy, pooling_overrides, learning_rate, extra_callbacks = run_options(name, strategy, config, tensorboard)
    recipe = preset_recipe(name, epochs=epochs, batch_size=batch_size, seed=seed, learning_rate=learning_rate)
    os.makedirs(out_dir, exist_ok=True)
    x_train, y_train = fashion_mnist_split("retrieval", "train", limit=limit, normalize=False, relabel=True)
    x_test, y_test = fashion_mnist_split("retrieval", "test", normalize=False)
    signals = [LayerSignals(x_train[:64].astype("float32"))] if tensorboard else []
    model, train_time = fit_embedding(name, x_train, y_train, recipe, strategy, pooling_overrides,
                                      signals + extra_callbacks + standard_callbacks(out_dir), verbose)
    metrics = retrieval_scores(model, x_test, y_test)
    return write_preset(model, name, out_dir, recipe, metrics, train_time, strategy,
                        reproducing_command(name, epochs=epochs, batch_size=batch_size, limit=limit, seed=seed,
                                            config=config),
                        evaluation="cosine retrieval among the 5,000 test images of classes 5-9, each a query "
                                   "against all others")


def evaluate_retrieval_preset(name, weights=None, limit=None):
    """Retrieval metrics of preset ``name`` (pretrained, or ``weights``) on the unseen classes' test images (the
    first ``limit`` test images before the class filter), next to the card's."""

    model = load(name, weights=weights)
    x_test, y_test = fashion_mnist_split("retrieval", "test", limit=limit, normalize=False)
    return dict(metrics=retrieval_scores(model, x_test, y_test), card_metrics=model_card(name).get("metrics"),
                examples=len(y_test))


train = train_retrieval_preset
evaluate = evaluate_retrieval_preset
