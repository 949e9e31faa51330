"""Fine-tuning a pretrained preset with ``model.fit`` (``otzoo fine-tune``): what a user does after ``zoo.load``.

Each task is fitted the way its recipe trains it, from the pretrained weights, with a small SGD step:
classification by cross-entropy on the training images (the hyperspherical head by its pull loss, with the labels
as a second input), retrieval by ProxyNCA++ on the seen classes' training images (fresh class proxies), few-shot on
base-class episodes (``training.data.episodes.episode_dataset``). The result is written with ``zoo.save_preset`` (Keras
config, weights, card), a directory that ``zoo.load``, ``otzoo export`` and ``otzoo explain --weights`` read.
"""
import keras
import numpy as np

from training.data.episodes import episode_dataset
from training.data.errors import EmptySliceError
from training.data.fashion_mnist import fashion_mnist_split, load_fashion_mnist
from training.data.pipelines import image_dataset
from training.recipes.classification import classification_training
from training.recipes.retrieval import retrieval_training
from zoo.loading import load, model_card, save_preset
from zoo.registry import PRESETS


BATCH_SIZE = 128  # classification and retrieval fine-tuning; an incomplete last batch is dropped
QUERIES = 15  # few-shot fine-tuning episodes: 1 support and 15 query images of each class


def _check_batch(images, limit, what):
    if len(images) < BATCH_SIZE:
        raise EmptySliceError(f"{len(images)} {what}, fewer than one batch of {BATCH_SIZE} (fine-tuning drops an "
                              "incomplete batch); give more images", parameter="limit", value=limit)


def _fit_target(name, model, limit, seed):
    """``(model that fit trains, its loss, its training data)`` for preset ``name``, as its recipe trains it.

    Raises :class:`EmptySliceError` when the first ``limit`` training images cannot fill one batch of
    :data:`BATCH_SIZE` (of the seen classes for retrieval) or, for few-shot, cannot supply an episode (``ways``
    base classes with ``1 + QUERIES`` images each)."""
    spec = PRESETS[name]
    if spec.task == "few_shot":
        images, labels = fashion_mnist_split("few_shot", "base", limit=limit, normalize=False, relabel=True)
        ways, needed = spec.architecture.ways, 1 + QUERIES
        counts = np.bincount(labels, minlength=ways)
        if np.sum(counts >= needed) < ways:
            raise EmptySliceError(
                f"{len(images)} base-class training images, {int(np.sum(counts >= needed))} base class(es) with "
                f"{needed} images or more; a {ways}-way episode needs {ways} (per class: {counts.tolist()}); "
                "give more images", parameter="limit", value=limit)
        episodes = max(1, len(images) // 80)  # about one pass over the images (5-way 1-shot, 15 queries)
        return model, keras.losses.SparseCategoricalCrossentropy(from_logits=True), episode_dataset(
            images, labels, episodes, ways=ways, shots=1, queries=QUERIES, seed=seed)
    if spec.task == "retrieval":
        images, labels = fashion_mnist_split("retrieval", "train", limit=limit, normalize=False, relabel=True)
        _check_batch(images, limit, "training images of the seen classes")
        trained, loss = retrieval_training(name, model, spec.recipe)
        return trained, loss, image_dataset(images, labels, BATCH_SIZE, training=True, seed=seed)
    images, labels = load_fashion_mnist("train", limit=limit, normalize=False)
    _check_batch(images, limit, "training images")
    trained, loss, _, feed = classification_training(name, model)  # no re-assignment while fine-tuning
    return trained, loss, image_dataset(images, labels, BATCH_SIZE, training=True, seed=seed).map(feed)


def fine_tune_preset(name, out_dir, epochs=1, limit=4096, learning_rate=0.01, seed=0, verbose=2):
    """Load preset ``name`` pretrained, fit it ``epochs`` times over the first ``limit`` training images (SGD with
    momentum 0.9 at ``learning_rate``), and save it into ``out_dir`` with ``zoo.save_preset``; returns the card
    written (the preset's card with ``fine_tuned`` describing this run).

    A slice too small to train on raises :class:`~training.data.errors.EmptySliceError` before anything is
    written."""
    keras.utils.set_random_seed(seed)
    model = load(name)
    trained, loss, data = _fit_target(name, model, limit, seed)
    trained.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9), loss=loss)
    history = trained.fit(data, epochs=epochs, verbose=verbose)
    card = dict(model_card(name), metrics=None, name=f"{name}_fine_tuned",
                fine_tuned=dict(base=name, epochs=epochs, limit=limit, learning_rate=learning_rate, seed=seed,
                                loss=[round(float(v), 4) for v in history.history["loss"]]))
    save_preset(model, out_dir, card=card)
    return card
