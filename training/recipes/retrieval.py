"""The retrieval presets' recipe: train on the seen classes with the recipe's proxy loss, evaluate on the unseen
ones.

The protocol of Gurbuz 2022 (ch. 5; Oh Song et al. 2016 for the fine-grained sets): the embedding model
(``zoo.embedding_model``: backbone, GAP or GSP pooling, Dense, L2 normalization) is trained with the recipe's loss
(ProxyNCA++, Teh et al. 2020, on ``ClassProxies``: ``zoo.proxy_training_model``) on the training images of the seen
classes (``CLASS_SPLITS[dataset]["retrieval"]["train"]``; Fashion-MNIST: classes 0-4), and evaluated by cosine
retrieval among the test images of the unseen classes (every image a query against all others): MAP@R, P@1 and R@k
(``training.evaluation.retrieval_metrics``). Both poolings share the recipe (optimizer, schedule, budget, data
order, augmentation); the GSP preset's recipe adds its GAP warm-up epoch and k-center prototype initialization
(callback ``GSPPrototypeInit``).

The other commands reach this task through the same module: :func:`fine_tune_setup` (``otzoo fine-tune``), the
tuning pieces :data:`TUNING_OBJECTIVE`, :func:`tuning_data`, :func:`tuning_parts`, :func:`tuning_score` (``otzoo
tune``: whole seen classes held out, scored by MAP@R), and :func:`check_evaluation_limit` (``otzoo evaluate
--limit``).
"""
import time

import keras
import numpy as np

from training.data.datasets import image_batches
from training.data.errors import EmptySliceError
from training.data.fashion_mnist import fashion_mnist_split
from training.data.pipelines import array_batches, predict_batches
from training.distributed.fit import check_callbacks, fit
from training.evaluation.retrieval import retrieval_metrics
from training.recipes.classification import TrainingSetup
from training.recipes.common import (
    FineTuneSetup,
    current_strategy,
    check_fine_tune_batch,
    evaluation_slice,
    evaluation_target,
    fine_tune_images,
    merged_overrides,
    preset_spec,
    reproducing_command,
    run_options,
    standard_callbacks,
    write_preset,
)
from training.recipes.components import compiled_step, make_callbacks, make_loss, make_optimizer
from training.recipes.run_directory import claim_run_directory, run_identity
from training.recipes.validation import VALIDATION_IMAGES_PER_CLASS, carve_validation, held_out_classes_split
from zoo.loading import build

# The card's metrics (NMI is left out: k-means makes it depend on its own seed and sklearn's version).
RETRIEVAL_METRICS = ("map_at_r", "precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8")
# The ``otzoo train`` options beyond the common ones that this task's ``train`` accepts (``--config``: a best.json
# of ``otzoo tune``), and the ``otzoo evaluate`` ones its ``evaluate`` accepts.
TRAIN_OPTIONS = ("config",)
EVALUATE_OPTIONS = ()
# What ``otzoo tune`` maximizes: MAP@R of cosine retrieval among seen classes held out of the trial's training.
TUNING_OBJECTIVE = "val_map_at_r"


def embed(model, batches):
    """``(outputs, labels)`` of ``model`` over a ``tf.data`` pipeline of ``(images, labels)`` batches (read in a fixed
    order: an evaluation pipeline), on any number of replicas (``training.data.pipelines.predict_batches``)."""
    return predict_batches(model, batches)


def retrieval_scores(model, images, labels=None, batch_size=256):
    """The card's retrieval metrics of ``model``'s embeddings, rounded to 4 decimals: of ``images`` (raw pixels)
    with ``labels``, or of a ``tf.data`` pipeline of ``(images, labels)`` batches. Classes with a single image
    (no relevant item for its query) are left out."""
    if labels is not None:
        images = array_batches(images, labels, batch_size)
    embeddings, labels = embed(model, images)
    classes, counts = np.unique(labels, return_counts=True)
    keep = np.isin(labels, classes[counts >= 2])  # a query needs another image of its class
    if keep.sum() < 2:
        raise EmptySliceError(f"the evaluation images hold no class with two images or more (per class: "
                              f"{dict(zip(classes.tolist(), counts.tolist()))}); retrieval metrics need them")
    scores = retrieval_metrics(embeddings[keep], labels[keep], metric="cosine", nmi=False)
    return {key: round(scores[key], 4) for key in RETRIEVAL_METRICS}


def retrieval_training(spec, model, recipe=None, num_classes=None):
    """``(the model fit trains, its loss)`` for retrieval preset ``spec``'s (a spec or a name) embedding ``model``:
    the recipe's loss (``recipe``: default the preset's) with fresh ``ClassProxies`` for the seen classes
    (``num_classes``, default the preset's)."""
    spec = preset_spec(spec)
    recipe = recipe or spec.recipe
    seen = spec.data.train_classes
    num_classes = num_classes or (len(seen) if seen else spec.data.num_classes)
    trained, loss, _ = make_loss(recipe, "retrieval", model, num_classes)
    return trained, loss


def compile_embedding(spec, recipe, steps, num_classes, strategy, overrides=None):
    """Build retrieval preset ``spec``'s embedding model under ``strategy`` and compile its proxy training model
    by ``recipe`` for ``steps`` optimizer steps: ``(model, trained, optimizer, loss)``."""
    with strategy.scope():
        model = build(spec, l2=recipe.l2, **(overrides or {}))
        trained, loss, _ = make_loss(recipe, "retrieval", model, num_classes)
        optimizer = make_optimizer(recipe, steps)
        trained.compile(optimizer=optimizer, loss=loss, jit_compile=compiled_step(recipe.jit_compile))
    return model, trained, optimizer, loss


def training_setup(spec, limit=None, strategy=None, head_overrides=None, data_dir=None):
    """The set-up of a run of retrieval preset ``spec`` (a ``zoo.spec.PresetSpec`` or a name) without training:
    the seen classes' training images (relabelled ``0..C-1``; ``limit``: the first ``limit`` images before the class
    filter), the compiled proxy training model, the recipe's callbacks. ``head_overrides``: ``zoo.build``'s (e.g.
    ``epsilon=0.2`` for the GSP pooling)."""
    spec = preset_spec(spec)
    recipe, data = spec.recipe, spec.data
    keras.utils.set_random_seed(recipe.seed)
    train = image_batches(data.dataset, "train", recipe.batch_size, protocol="retrieval", training=True,
                          augment=recipe.augment, pad=recipe.pad, seed=recipe.seed, limit=limit, relabel=True,
                          image_size=data.input_shape[0], data_dir=data_dir)
    steps = train.examples // recipe.batch_size * recipe.epochs
    model, trained, optimizer, loss = compile_embedding(spec, recipe, steps, len(data.train_classes),
                                                        current_strategy(strategy), head_overrides)
    callbacks = make_callbacks(recipe, model, train.sample)  # before BackupAndRestore: a backup holds their state
    return TrainingSetup(spec, model, trained, optimizer, loss, callbacks, train, None, lambda x, y: (x, y), steps)


def fit_embedding(name, images, labels, recipe, strategy, overrides=None, callbacks=(), verbose=2):
    """Build retrieval preset ``name``'s embedding model (``overrides``: ``zoo.build``'s, e.g. ``epsilon=0.2`` for
    the GSP pooling) under ``strategy`` and train it by ``recipe`` on ``images`` (raw pixels, in memory) and
    ``labels`` (``0..C-1``; one proxy set per class present), with the recipe's callbacks before ``callbacks``.
    Returns ``(model, seconds of training)``."""
    spec = preset_spec(name)
    if len(images) < recipe.batch_size:
        raise EmptySliceError(f"`images`: {len(images)} training images of the seen classes, fewer than one batch "
                              f"of {recipe.batch_size}.")
    keras.utils.set_random_seed(recipe.seed)
    steps = len(images) // recipe.batch_size * recipe.epochs
    model, trained, _, _ = compile_embedding(spec, recipe, steps, int(labels.max()) + 1, strategy, overrides)
    train = array_batches(images, labels, recipe.batch_size, training=True, pad=recipe.pad, seed=recipe.seed,
                          augment=recipe.augment)
    start = time.time()
    fit(trained, train, epochs=recipe.epochs, verbose=verbose,
        callbacks=make_callbacks(recipe, model, images) + list(callbacks))
    return model, time.time() - start


def train(name, out_dir, epochs=None, batch_size=None, limit=None, seed=None, verbose=2, strategy="auto",
          config=None, tensorboard=None, dataset=None, image_size=None, data_dir=None, recipe_overrides=None,
          callbacks=None, command=None):
    """Train retrieval preset ``name`` by its recipe; returns the card (also in ``out_dir/metadata.json``, with
    ``config.json`` and ``model.weights.h5``).

    ``epochs``, ``batch_size``, ``seed`` override the recipe's; ``limit`` reads only the first ``limit`` training
    images (before keeping the seen classes); ``dataset``: a name of ``training.data.datasets.DATASETS`` instead of the
    preset's, trained and evaluated on its retrieval class split (``image_size``, ``data_dir``: its TFDS images'
    side and folder); ``strategy``, ``config``, ``tensorboard``: see ``training.recipes.common.run_options``;
    ``callbacks``: more Keras callbacks for the run, after the recipe's own and the backup's. ``command``: the
    card's ``command``, by default the ``otzoo train`` command of these arguments (``--out out_dir`` among them);
    ``otzoo train`` gives the one it ran as.
    """
    callbacks = check_callbacks(callbacks)  # before the data are read and the model built
    strategy, pooling_overrides, learning_rate, extra_callbacks = run_options(name, strategy, config, tensorboard)
    spec = preset_spec(name, dataset=dataset, image_size=image_size, **merged_overrides(
        recipe_overrides, epochs=epochs, batch_size=batch_size, seed=seed, learning_rate=learning_rate))
    setup = training_setup(spec, limit=limit, strategy=strategy, head_overrides=pooling_overrides, data_dir=data_dir)
    claim_run_directory(out_dir, run_identity(spec, limit=limit, head=pooling_overrides))
    start = time.time()
    fit(setup.trained, setup.train.dataset, epochs=spec.recipe.epochs, verbose=verbose,
        callbacks=setup.callbacks + standard_callbacks(out_dir, setup.train.sample) + extra_callbacks
        + callbacks)
    train_time = time.time() - start
    test = _unseen_test_images(spec, None, data_dir)
    metrics = retrieval_scores(setup.model, test.dataset)
    if command is None:
        command = reproducing_command(name, recipe_overrides, out=out_dir, dataset=dataset, image_size=image_size,
                                      epochs=epochs, batch_size=batch_size, limit=limit, seed=seed, config=config)
    return write_preset(setup.model, spec, out_dir, spec.recipe, metrics, train_time, strategy, command,
                        head_overrides=pooling_overrides, limit=limit,
                        evaluation=f"cosine retrieval among the {test.examples:,} test images of the unseen classes, "
                                   "each a query against all others")


def _unseen_test_images(spec, limit, data_dir, batch_size=256):
    return image_batches(spec.data.dataset, "test", batch_size, protocol="retrieval", limit=limit,
                         image_size=spec.data.input_shape[0], data_dir=data_dir)


def evaluate(preset, weights=None, limit=None, data_dir=None):
    """Retrieval metrics of preset ``preset`` (a name: pretrained, or ``weights``; or a preset directory ``otzoo
    train`` wrote) on the unseen classes' test images of its data set (the first ``limit`` test images before the
    class filter), next to the card's: ``{"metrics", "card_metrics", "examples"}``."""
    model, spec, card = evaluation_target(preset, weights)
    test = _unseen_test_images(spec, limit, data_dir)
    return dict(metrics=retrieval_scores(model, test.dataset), card_metrics=card.get("metrics"),
                examples=test.examples)


def check_evaluation_limit(spec, limit):
    """``otzoo evaluate --limit`` of retrieval preset ``spec`` on Fashion-MNIST: the unseen classes among the first
    ``limit`` test images must hold two images or more of each class there (every image is a query against the
    others), else :class:`EmptySliceError` naming ``limit``, before the model is loaded. Other data sets are checked
    as they are read."""
    if limit is None or spec.data.dataset != "fashion_mnist":
        return
    _, labels = fashion_mnist_split("retrieval", "test", limit=limit, normalize=False)
    counts, held = evaluation_slice(limit, labels)
    if len(labels) < 2 or counts.min() < 2:
        raise EmptySliceError(f"{held}; retrieval metrics need two images or more of each class (every image is a "
                              "query against the others); give more test images", "limit", limit)


def fine_tune_setup(spec, model, limit, seed, batch_size, queries):
    """What ``otzoo fine-tune`` fits for retrieval preset ``spec`` (a spec or a name; a preset directory's spec carries
    its card's recipe): a :class:`FineTuneSetup` (the model fit trains, its loss, its training data, the same images
    without augmentation, what an epoch fits in words): the served embedding ``model`` (pretrained) with fresh class
    proxies, by the recipe's proxy loss, on the seen classes among the first ``limit`` Fashion-MNIST training images in
    shuffled batches of ``batch_size`` (``seed``; an incomplete last batch dropped). ``queries``: unused (few-shot
    episodes only). Raises :class:`EmptySliceError` naming ``limit`` when they cannot fill one batch."""
    spec = preset_spec(spec)
    images, labels = fashion_mnist_split("retrieval", "train", limit=limit, normalize=False, relabel=True)
    check_fine_tune_batch(images, batch_size, limit, "training images of the seen classes")
    trained, loss = retrieval_training(spec, model, spec.recipe)
    return FineTuneSetup(trained, loss, array_batches(images, labels, batch_size, training=True, seed=seed),
                         array_batches(images, labels, batch_size),
                         fine_tune_images(len(images), batch_size, "training images of the seen classes", among=limit))


def tuning_data(limit, validation_fraction, seed):
    """``(train, val, description)`` of an ``otzoo tune`` search: the seen classes among the first ``limit``
    Fashion-MNIST training images (never the test split), the last ``validation_fraction`` of those classes (two
    at least) held out to score the trials by retrieval among them (their first
    ``VALIDATION_IMAGES_PER_CLASS`` images each), the others, relabelled ``0..C'-1``, to train on. ``seed``:
    unused (the split is by class)."""
    images, labels = fashion_mnist_split("retrieval", "train", limit=limit, normalize=False)
    train, val = carve_validation(held_out_classes_split, images, labels, limit, validation_fraction)
    description = (f"training images of the seen classes: classes {sorted(set(np.unique(val[1]).tolist()))} held "
                   f"out (first {VALIDATION_IMAGES_PER_CLASS} images each) to score retrieval, the others trained "
                   "on")
    return train, val, description


def tuning_parts(spec, served, train, recipe):
    """``(the model fit trains, its loss, the recipe's layer callbacks, None: batches fed as they are)`` of one
    ``otzoo tune`` trial of retrieval preset ``spec`` on the ``served`` embedding model (the trial's pooling
    arguments), by ``recipe``, with one proxy set per class of the trial's ``train`` ``(images, labels)``; the
    callbacks (e.g. GSP's prototype initialization) initialize from those images."""
    images, labels = train
    trained, loss = retrieval_training(spec, served, recipe, num_classes=int(labels.max()) + 1)
    return trained, loss, make_callbacks(recipe, served, images), None


def tuning_score(outputs, labels):
    """A trial's score (:data:`TUNING_OBJECTIVE`): MAP@R of cosine retrieval among the held-out classes' embeddings
    ``outputs`` (``labels``), every image a query."""
    return retrieval_metrics(outputs, labels, metric="cosine", nmi=False)["map_at_r"]
