"""Fine-tuning a pretrained preset with ``model.fit`` (``otzoo fine-tune``): what a user does after ``zoo.load``.

What is fine-tuned is a built-in preset's packaged weights or a preset directory's (an ``otzoo train`` run, an
earlier fine-tuning run); its card keeps the history of the runs before. Each task is fitted the way its recipe
(a directory's: its card's) trains it, from the loaded weights, with a small SGD step; what is fitted
on what comes from the task's recipe module (its ``fine_tune_setup``, reached through
``training.recipes.recipe_for``): classification by cross-entropy on the training images (the hyperspherical head by
its pull loss, with the labels as a second input), retrieval by ProxyNCA++ on the seen classes' training images
(fresh class proxies: imprinted ones, at the class means of the pretrained embeddings, were measured no better for
the unseen classes, ``experiments/fine_tune_proxies.py``), few-shot on base-class episodes
(``training.data.episodes.EpisodeBatches``). The images are Fashion-MNIST's (:data:`FINE_TUNE_DATASET`): a preset
of another data set is refused. The result is written with ``zoo.save_preset`` (Keras config, weights, card), a
directory that ``zoo.load``, ``otzoo evaluate``, ``otzoo export``, ``otzoo explain`` and ``otzoo fine-tune`` read.
"""
import datetime
import os
import time

import keras

from ot_layers.validation import check_positive, check_positive_int, check_seed
from training.distributed.keras_distribution import hardware_description
from training.recipes import recipe_for
from training.recipes.common import card_base_preset, card_spec, preset_spec, reproducing_command
from zoo.loading import load, model_card, save_preset
from zoo.preset_format import check_output_directory, preset_card
from zoo.registry import PRESETS

BATCH_SIZE = 128  # classification and retrieval fine-tuning; an incomplete last batch is dropped
QUERIES = 15  # few-shot fine-tuning episodes: 1 support and 15 query images of each class
FINE_TUNE_DATASET = "fashion_mnist"  # the only data set fine-tuning reads
# A card's fields that describe the run its weights come from (a few-shot run's meta-training history included): a
# fine-tuned card states its own run there and keeps the one before under ``fine_tuned["base_run"]``.
RUN_FIELDS = ("metrics", "train_time_s", "hardware", "backend", "strategy", "command", "date", "note",
              "meta_training")


def fine_tune_source(preset):
    """``(spec, card, base)`` of what fine-tuning fits: for a built-in preset's name, its spec, its packaged card and
    the name; for a preset directory (an ``otzoo train`` run, a fine-tuned run, a copy), the spec of its card (the
    card's recipe, whose loss fine-tuning fits, on the architecture of the preset it comes from), the card and that
    built-in preset (:func:`~training.recipes.common.card_base_preset`). A ``ValueError`` (its message starts with
    what it is about) when ``preset`` is neither, when the directory's card names no built-in preset, or when the data
    set is not :data:`FINE_TUNE_DATASET`."""
    if isinstance(preset, str) and preset in PRESETS:
        spec, card, base = preset_spec(preset), model_card(preset), preset
    elif os.path.isdir(str(preset)):
        card = preset_card(preset)  # a directory without a card: a FileNotFoundError naming it
        try:
            base, spec = card_base_preset(card), card_spec(card)
        except ValueError as error:
            raise ValueError(f"the card of {str(preset)!r}: {error}") from None
    else:
        raise ValueError(f"{preset!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a preset directory.")
    if spec.data.dataset != FINE_TUNE_DATASET:
        raise ValueError(f"{preset} trains on {spec.data.dataset}; fine-tuning reads Fashion-MNIST only.")
    return spec, card, base


def fine_tune_preset(preset, out_dir, epochs=1, limit=4096, learning_rate=0.01, seed=0, verbose=2):
    """Load ``preset`` (a built-in preset's name: pretrained; or a preset directory, such as an ``otzoo train`` or an
    earlier fine-tuning run), fit it ``epochs`` times over the first ``limit`` training images (SGD with momentum 0.9
    at ``learning_rate``; in full batches of :data:`BATCH_SIZE`, an incomplete last one dropped) by the loss of its
    recipe (a directory's: its card's), and save it into ``out_dir`` with ``zoo.save_preset``; returns the card
    written (:func:`fine_tuned_card`: ``fine_tuned`` describes this run: the Keras backend it ran on, what an epoch
    fitted in words (``fitted``: the images actually fitted, the task's recipe's ``fine_tune_setup``), the loss per
    epoch, and the loss on the slice before and after fitting, on the same inputs both times: the slice's images
    without augmentation, or the same episodes).

    A ``preset`` that is neither a preset name nor a preset directory, whose card names no built-in preset, or of a
    data set other than Fashion-MNIST raises ``ValueError`` naming ``preset``; a slice too small to train on (fewer
    than one batch of :data:`BATCH_SIZE`, of the seen classes for retrieval, or for few-shot too few base classes
    with ``1 + QUERIES`` images for an episode) raises :class:`~training.data.errors.EmptySliceError`, both before
    anything is written."""
    try:
        spec, card, base = fine_tune_source(preset)
    except ValueError as error:
        raise ValueError(f"`preset`: {error}") from None
    check_output_directory("out_dir", out_dir, new_preset=True)
    check_positive_int("epochs", epochs)
    check_positive("learning_rate", learning_rate)
    keras.utils.set_random_seed(check_seed("seed", seed))
    model = load(preset)
    setup = recipe_for(spec.task).fine_tune_setup(spec, model, limit, seed, BATCH_SIZE, QUERIES)
    setup.trained.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9), loss=setup.loss)
    before = float(setup.trained.evaluate(setup.evaluation, verbose=0))  # the slice without augmentation
    start = time.time()
    history = setup.trained.fit(setup.data, epochs=epochs, verbose=verbose, shuffle=False)  # their seeded order
    train_time = time.time() - start
    after = float(setup.trained.evaluate(setup.evaluation, verbose=0))
    card = fine_tuned_card(base, epochs, limit, learning_rate, seed, history.history["loss"], train_time,
                           out_dir=out_dir, source=None if preset == base else str(preset), base_card=card,
                           fitted=setup.fitted, loss_on_slice_before_after=[round(before, 4), round(after, 4)])
    return preset_card(save_preset(model, out_dir, card=card))  # as written: with the new weights' sha256


def fine_tuned_card(name, epochs, limit, learning_rate, seed, losses, train_time, command=None, out_dir=None,
                    source=None, base_card=None, **measured):
    """The card of built-in preset ``name``'s weights fine-tuned on the active backend: ``base_card`` (default the
    preset's packaged card; a preset directory's, where ``source``, the directory, was fine-tuned) whose run fields
    (:data:`RUN_FIELDS`) describe this run (``train_time`` seconds of fitting, this machine and backend, ``command``:
    by default the ``otzoo fine-tune ... --out out_dir`` command that repeats it; no ``metrics``, which fine-tuning
    does not measure), and ``fine_tuned`` naming the base preset, the ``preset_directory`` fine-tuned (``source``),
    the run's settings, the backend, the loss per epoch, ``measured``'s fields and ``base_run``: the run the weights
    came from, the base card's run fields (its training command and test metrics among them), with its own
    ``fine_tuned`` where that card was fine-tuned already, so the history of every run is kept."""
    base = model_card(name) if base_card is None else base_card
    if command is None:
        command = reproducing_command(source or name, subcommand="fine-tune", out=out_dir, epochs=epochs,
                                      limit=limit, learning_rate=learning_rate, seed=seed)
    base_run = {key: base[key] for key in (*RUN_FIELDS, "fine_tuned") if key in base}
    card = {key: value for key, value in base.items() if key not in RUN_FIELDS}
    card.update(name=f"{name}_fine_tuned", metrics=None, train_time_s=round(train_time, 1),
                hardware=hardware_description(), backend=keras.backend.backend(), command=command,
                date=datetime.date.today().isoformat(),
                note="metrics: not measured after fine-tuning (otzoo evaluate measures them); fine_tuned.base_run "
                     "holds the run the weights came from (the base preset's training run and metrics, or the "
                     "fine-tuned preset directory's run)",
                fine_tuned=dict(base=name, **({"preset_directory": source} if source else {}), epochs=epochs,
                                limit=limit, learning_rate=learning_rate, seed=seed, backend=keras.backend.backend(),
                                loss=[round(float(v), 4) for v in losses], **measured, base_run=base_run))
    return card
