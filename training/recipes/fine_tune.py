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
import datetime
import time

import keras

from ot_layers.validation import check_positive, check_positive_int, check_seed
from training.distributed.keras_distribution import hardware_description
from training.recipes import recipe_for
from training.recipes.common import preset_spec, reproducing_command
from zoo.loading import load, model_card, save_preset
from zoo.preset_format import check_output_directory

BATCH_SIZE = 128  # classification and retrieval fine-tuning; an incomplete last batch is dropped
QUERIES = 15  # few-shot fine-tuning episodes: 1 support and 15 query images of each class
FINE_TUNE_DATASET = "fashion_mnist"  # the only data set fine-tuning reads
# A card's fields that describe the run its weights come from (a few-shot run's meta-training history included): a
# fine-tuned card states its own run there and keeps the base preset's under ``fine_tuned["base_run"]``.
RUN_FIELDS = ("metrics", "train_time_s", "hardware", "backend", "strategy", "command", "date", "note",
              "meta_training")


def check_fine_tunable(name):
    """The spec of preset ``name`` if fine-tuning can read its data set (:data:`FINE_TUNE_DATASET`), else a
    ``ValueError`` naming ``preset`` (an unknown name too)."""
    spec = preset_spec(name)
    if spec.data.dataset != FINE_TUNE_DATASET:
        raise ValueError(f"`preset` {name!r} trains on {spec.data.dataset}; fine-tuning reads Fashion-MNIST only.")
    return spec


def fine_tune_preset(name, out_dir, epochs=1, limit=4096, learning_rate=0.01, seed=0, verbose=2):
    """Load preset ``name`` pretrained, fit it ``epochs`` times over the first ``limit`` training images (SGD with
    momentum 0.9 at ``learning_rate``; in full batches of :data:`BATCH_SIZE`, an incomplete last one dropped), and
    save it into ``out_dir`` with ``zoo.save_preset``; returns the card written (the preset's card with
    ``fine_tuned`` describing this run: the Keras backend it ran on, what an epoch fitted in words (``fitted``: the
    images actually fitted, the task's recipe's ``fine_tune_setup``), the loss per epoch, and the loss on the slice
    before and after fitting, evaluated the same way).

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
    trained, loss, data, fitted = recipe_for(spec.task).fine_tune_setup(name, model, limit, seed, BATCH_SIZE,
                                                                        QUERIES)
    trained.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9), loss=loss)
    before = float(trained.evaluate(data, verbose=0))
    start = time.time()
    history = trained.fit(data, epochs=epochs, verbose=verbose, shuffle=False)  # the batches' own seeded order
    train_time = time.time() - start
    after = float(trained.evaluate(data, verbose=0))
    card = fine_tuned_card(name, epochs, limit, learning_rate, seed, history.history["loss"], train_time,
                           out_dir=out_dir, fitted=fitted,
                           loss_on_slice_before_after=[round(before, 4), round(after, 4)])
    save_preset(model, out_dir, card=card)
    return card


def fine_tuned_card(name, epochs, limit, learning_rate, seed, losses, train_time, command=None, out_dir=None,
                    **measured):
    """The card of preset ``name`` fine-tuned on the active backend: its own card whose run fields
    (:data:`RUN_FIELDS`) describe this run (``train_time`` seconds of fitting, this machine and backend, ``command``:
    by default the ``otzoo fine-tune ... --out out_dir`` command that repeats it; no ``metrics``, which fine-tuning
    does not measure), and ``fine_tuned`` naming the base, the run's settings, the backend, the loss per epoch,
    ``measured``'s fields and ``base_run``, the base card's run fields (its training command and test metrics among
    them)."""
    base = model_card(name)
    if command is None:
        command = reproducing_command(name, subcommand="fine-tune", out=out_dir, epochs=epochs, limit=limit,
                                      learning_rate=learning_rate, seed=seed)
    card = {key: value for key, value in base.items() if key not in RUN_FIELDS}
    card.update(name=f"{name}_fine_tuned", metrics=None, train_time_s=round(train_time, 1),
                hardware=hardware_description(), backend=keras.backend.backend(), command=command,
                date=datetime.date.today().isoformat(),
                note="metrics: not measured after fine-tuning (otzoo evaluate measures them); fine_tuned.base_run "
                     "holds the base preset's training run and metrics",
                fine_tuned=dict(base=name, epochs=epochs, limit=limit, learning_rate=learning_rate, seed=seed,
                                backend=keras.backend.backend(), loss=[round(float(v), 4) for v in losses],
                                **measured, base_run={key: base[key] for key in RUN_FIELDS if key in base}))
    return card
