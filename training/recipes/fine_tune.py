"""Fine-tuning a pretrained preset with ``model.fit`` (``otzoo fine-tune``): what a user does after ``zoo.load``.

Each task is fitted the way its recipe trains it, from the pretrained weights, with a small SGD step; what is fitted
on what comes from the task's recipe module (its ``fine_tune_setup``, reached through
``training.recipes.recipe_for``): classification by cross-entropy on the training images (the hyperspherical head by
its pull loss, with the labels as a second input), retrieval by ProxyNCA++ on the seen classes' training images
(fresh class proxies), few-shot on base-class episodes (``training.data.episodes.EpisodeBatches``). The images are
Fashion-MNIST's (:data:`FINE_TUNE_DATASET`): a preset of another data set is refused. The result is written with
``zoo.save_preset`` (Keras config, weights, card), a directory that ``zoo.load``, ``otzoo export`` and ``otzoo
explain --weights`` read.
"""
import keras

from ot_layers.validation import check_positive, check_positive_int, check_seed
from training.recipes import recipe_for
from training.recipes.common import preset_spec
from zoo.loading import load, model_card, save_preset
from zoo.preset_format import check_output_directory

BATCH_SIZE = 128  # classification and retrieval fine-tuning; an incomplete last batch is dropped
QUERIES = 15  # few-shot fine-tuning episodes: 1 support and 15 query images of each class
FINE_TUNE_DATASET = "fashion_mnist"  # the only data set fine-tuning reads


def check_fine_tunable(name):
    """The spec of preset ``name`` if fine-tuning can read its data set (:data:`FINE_TUNE_DATASET`), else a
    ``ValueError`` naming ``preset`` (an unknown name too)."""
    spec = preset_spec(name)
    if spec.data.dataset != FINE_TUNE_DATASET:
        raise ValueError(f"`preset` {name!r} trains on {spec.data.dataset}; fine-tuning reads Fashion-MNIST only.")
    return spec


def fine_tune_preset(name, out_dir, epochs=1, limit=4096, learning_rate=0.01, seed=0, verbose=2):
    """Load preset ``name`` pretrained, fit it ``epochs`` times over the first ``limit`` training images (SGD with
    momentum 0.9 at ``learning_rate``), and save it into ``out_dir`` with ``zoo.save_preset``; returns the card
    written (the preset's card with ``fine_tuned`` describing this run: the Keras backend it ran on, the loss per
    epoch, and the loss on the slice before and after fitting, evaluated the same way).

    A preset of a data set other than Fashion-MNIST raises ``ValueError``; a slice too small to train on (fewer
    than one batch of :data:`BATCH_SIZE`, of the seen classes for retrieval, or for few-shot too few base classes
    with ``1 + QUERIES`` images for an episode) raises :class:`~training.data.errors.EmptySliceError`, both before
    anything is written."""
    spec = check_fine_tunable(name)
    check_output_directory("out_dir", out_dir, new_preset=True)
    check_positive_int("epochs", epochs)
    check_positive("learning_rate", learning_rate)
    keras.utils.set_random_seed(check_seed("seed", seed))
    model = load(name)
    trained, loss, data = recipe_for(spec.task).fine_tune_setup(name, model, limit, seed, BATCH_SIZE, QUERIES)
    trained.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9), loss=loss)
    before = float(trained.evaluate(data, verbose=0))
    history = trained.fit(data, epochs=epochs, verbose=verbose, shuffle=False)  # the batches' own seeded order
    after = float(trained.evaluate(data, verbose=0))
    card = fine_tuned_card(name, epochs, limit, learning_rate, seed, history.history["loss"],
                           loss_on_slice_before_after=[round(before, 4), round(after, 4)])
    save_preset(model, out_dir, card=card)
    return card


def fine_tuned_card(name, epochs, limit, learning_rate, seed, losses, **measured):
    """The card of preset ``name`` fine-tuned on the active backend: its own card with no ``metrics`` (not measured
    after fine-tuning) and ``fine_tuned`` naming the base, the run's settings, the backend, the loss per epoch and
    ``measured``'s fields."""
    return dict(model_card(name), metrics=None, name=f"{name}_fine_tuned",
                fine_tuned=dict(base=name, epochs=epochs, limit=limit, learning_rate=learning_rate, seed=seed,
                                backend=keras.backend.backend(), loss=[round(float(v), 4) for v in losses],
                                **measured))
