"""The few-shot presets' recipe: pre-train on the base classes, meta-train on base episodes, test on novel ones.

DeepEMD's protocol (Zhang et al. 2022) on the data set's few-shot class split (``CLASS_SPLITS[dataset]["few_shot"]``;
Fashion-MNIST: base classes 0-4 of the training images, novel classes 5-9 of the test images).

1. Pre-training: the backbone + global average pooling + ``Dense(len(base classes))`` (``zoo.image_classifier(...,
   "gap_fc")``) trained by cross-entropy on the base images with the recipe's optimizer, schedule, L2 and
   augmentation (``training.distributed.fit``, whose epoch backups make it resumable); the backbone's weights are
   kept in ``pretrained_backbone.weights.h5``, and ``pretrained=`` re-uses them from another run of the same recipe
   (the EMD preset and its ProtoNet baseline share one pre-training; a run given ``pretrained`` takes the
   pre-training fields that run recorded, and refuses other values, which it would not use).
2. Meta-training of the few-shot model (``zoo.few_shot_model``, the preset's head) on ``ways``-way ``shots``-shot
   episodes of the base classes (``queries`` per class) by the recipe's ``meta_optimizer``, one episode a step
   (:func:`meta_train`, checkpointed; Keras' own training step, so on every backend).
3. Evaluation: ``ways``-way episodes of the novel classes for each of ``eval_shots``, a fixed episode seed, mean
   accuracy +- 95 % interval (``training.evaluation.few_shot.few_shot_accuracy``).

The other commands reach this task through the same module: :func:`fine_tune_setup` (``otzoo fine-tune``: base-class
episodes for ``model.fit``) and :func:`check_evaluation_limit` (``otzoo evaluate --limit``). A few-shot preset is
not tunable (:data:`TUNING_OBJECTIVE` is ``None``).
"""
import os
import time
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np

from ot_layers.callbacks.layer_signals import LayerSignals
from ot_layers.validation import check_positive_int
from training.data.datasets import image_arrays
from training.data.episodes import EpisodeBatches
from training.data.errors import EmptySliceError
from training.data.fashion_mnist import fashion_mnist_split
from training.data.pipelines import array_batches
from training.distributed.checkpoints import POINTER_FILE, load_weights_backup, save_weights_backup
from training.distributed.fit import fit
from training.evaluation.few_shot import few_shot_accuracy
from training.recipes.common import (
    FineTuneSetup,
    current_strategy,
    evaluation_slice,
    evaluation_target,
    merged_overrides,
    preset_spec,
    reproducing_command,
    run_options,
    standard_callbacks,
    write_preset,
)
from training.recipes.components import RecipeError, compiled_step, make_meta_optimizer, make_optimizer
from training.recipes.run_directory import RUN_FILE, claim_run_directory, read_mark, run_identity
from zoo.loading import build
from zoo.preset_format import PresetFormatError
from zoo.spec import recipe_from_dict
from zoo.models import image_classifier

PRETRAINED_FILE = "pretrained_backbone.weights.h5"
META_CHECKPOINTS = "meta_checkpoints"  # in the run directory: meta-training's checkpoints, resumed from
# The ``otzoo train`` options beyond the common ones that this task's ``train`` accepts (``--episodes``: the
# meta-training episodes; ``--pretrained``: another run's pre-trained backbone), and the ``otzoo evaluate`` ones its
# ``evaluate`` accepts (``--episodes``: evaluation episodes per setting).
TRAIN_OPTIONS = ("episodes", "pretrained")
EVALUATE_OPTIONS = ("episodes",)
# ``otzoo tune`` does not run few-shot trials: they would need the episodic recipe (pre-training, meta-training) in
# every trial, which the search does not wire; ``None`` marks the task as not tunable.
TUNING_OBJECTIVE = None


def few_shot_scores(model, spec, recipe=None, limit=None, episodes=None, verbose=0, data_dir=None):
    """The card's metrics: ``{"5way_1shot": {"mean", "ci95", "episodes"}, ...}`` on the novel classes' images of
    ``spec``'s data set (the first ``limit`` images of their source split before the class filter), ``episodes``
    (default the recipe's ``eval_episodes``) per setting; also returns the number of novel images."""
    recipe = recipe or spec.recipe
    images, labels = image_arrays(spec.data.dataset, "novel", protocol="few_shot", limit=limit,
                                  image_size=spec.data.input_shape[0], data_dir=data_dir)
    ways = spec.architecture.ways
    metrics = {}
    for shots in recipe.eval_shots:
        count = recipe.eval_episodes if episodes is None else episodes  # 0 is refused, not the default
        result = few_shot_accuracy(model, images, labels, ways, shots, recipe.eval_queries, count, recipe.eval_seed,
                                   verbose=verbose)
        metrics[f"{ways}way_{shots}shot"] = {key: round(value, 4) if isinstance(value, float) else value
                                             for key, value in result.items()}
    return metrics, len(labels)


# The recipe fields pre-training alone reads (``pretrain_epochs`` is ``--epochs``): a run given ``pretrained`` skips
# pre-training, so they are those the backbone was pre-trained with (:func:`pretraining_fields`).
PRETRAINING_FIELDS = ("pretrain_epochs", "batch_size", "optimizer", "learning_rate", "momentum", "nesterov",
                      "schedule", "l2", "augment", "pad")


def pretraining_fields(pretrained, preset_recipe):
    """``{field: value}`` of :data:`PRETRAINING_FIELDS` that the backbone in ``pretrained`` (a run directory, or a
    ``pretrained_backbone.weights.h5`` in one) was pre-trained with: the recipe that run recorded in its
    ``run.json``, where it is a few-shot run's; else (no record, as for a file moved elsewhere) those of
    ``preset_recipe``, the preset's."""
    folder = pretrained if os.path.isdir(pretrained) else os.path.dirname(os.path.abspath(pretrained))
    record = read_mark(os.path.join(folder, RUN_FILE))
    source = preset_recipe
    if isinstance(record, dict) and record.get("task") == "few_shot" and isinstance(record.get("recipe"), dict):
        try:
            source = recipe_from_dict("few_shot", record["recipe"])
        except ValueError:  # a record this otzoo cannot read: the preset's, as without one
            pass
    return {field: getattr(source, field) for field in PRETRAINING_FIELDS}


def check_pretraining_fields(recipe, given, reference):
    """A run given ``pretrained`` skips pre-training: raise one :class:`~training.recipes.components.RecipeError` (a
    ``ValueError``; ``otzoo train`` prints it in one line) naming the first field of :data:`PRETRAINING_FIELDS`
    among ``given`` (the overrides' names) where ``recipe`` (the run's, overrides applied) differs from
    ``reference`` (:func:`pretraining_fields`), which the run would ignore yet publish in its card."""
    for field in PRETRAINING_FIELDS:
        value = getattr(recipe, field)
        if field in given and value != reference[field]:
            option = " (`epochs`)" if field == "pretrain_epochs" else ""
            raise RecipeError(f"recipe field `{field}`{option} ({value!r}) sets pre-training, which `pretrained` "
                             f"skips (its backbone was pre-trained with {reference[field]!r}): leave it out.")


def pretrained_backbone_path(pretrained):
    """The pre-trained backbone file of ``pretrained`` (a run directory or the file) as a ``str``, or
    ``FileNotFoundError``."""
    path = os.path.join(pretrained, PRETRAINED_FILE) if os.path.isdir(pretrained) else pretrained
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`pretrained`: no pre-trained backbone at {path!r} (give a run directory of a "
                                f"few-shot preset holding {PRETRAINED_FILE}, or that file).")
    return os.fspath(path)


@dataclass
class FewShotSetup:
    """What a few-shot run trains with: the ``spec``, the few-shot ``model``; the base ``images`` and ``labels``
    (relabelled ``0..C-1``, raw pixels); the pre-training ``classifier`` (the model's backbone + GAP + Dense)
    compiled with ``pretrain_optimizer`` and ``pretrain_loss`` on ``pretrain_data``; the ``meta_optimizer``."""
    spec: Any
    model: keras.Model
    images: np.ndarray
    labels: np.ndarray
    classifier: keras.Model
    pretrain_optimizer: Any
    pretrain_loss: Any
    pretrain_data: Any
    meta_optimizer: Any


def training_setup(spec, limit=None, strategy=None, data_dir=None):
    """The set-up of a run of few-shot preset ``spec`` (a ``zoo.spec.PresetSpec`` or a name) without training:
    every recipe field is read here (the pre-training optimizer, schedule and augmentation, the meta optimizer).
    ``limit``: the first ``limit`` images of the base classes' source split, before the class filter."""
    spec = preset_spec(spec)
    recipe, data = spec.recipe, spec.data
    keras.utils.set_random_seed(recipe.seed)
    images, labels = image_arrays(data.dataset, "base", protocol="few_shot", limit=limit, relabel=True,
                                  image_size=data.input_shape[0], data_dir=data_dir)
    if len(images) < recipe.batch_size:
        raise EmptySliceError(f"{len(images)} base-class training images, fewer than one batch of "
                              f"{recipe.batch_size}.", "limit", limit)
    _check_episodes(labels, recipe, limit)
    steps = len(images) // recipe.batch_size * recipe.pretrain_epochs
    with current_strategy(strategy).scope():
        model = build(spec, l2=recipe.l2)
        classifier = image_classifier(model.get_layer("backbone"), "gap_fc", len(data.train_classes),
                                      data.pixel_mean, data.pixel_std, name=f"{spec.name}_pretraining")
        optimizer = make_optimizer(recipe, steps)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        classifier.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"],
                           jit_compile=compiled_step(recipe.jit_compile))
    pretrain_data = array_batches(images, labels, recipe.batch_size, training=True, pad=recipe.pad, seed=recipe.seed,
                                  augment=recipe.augment)
    return FewShotSetup(spec, model, images, labels, classifier, optimizer, loss, pretrain_data,
                        make_meta_optimizer(recipe))


def _check_episodes(labels, recipe, limit):
    """Meta-training draws ``ways``-way episodes of ``shots + queries`` images per class from the base ``labels``:
    raise :class:`EmptySliceError` naming ``limit`` before pre-training when too few classes have that many."""
    classes, counts = np.unique(labels, return_counts=True)
    needed = recipe.shots + recipe.queries
    usable = int(np.sum(counts >= needed))
    if usable < recipe.ways:
        raise EmptySliceError(f"{len(labels)} base-class training images, {usable} base class(es) with {needed} "
                              f"images or more; {recipe.ways}-way {recipe.shots}-shot meta-training episodes with "
                              f"{recipe.queries} queries need {recipe.ways} (per class: "
                              f"{dict(zip(classes.tolist(), counts.tolist()))})", "limit", limit)


def pretrain_backbone(setup, out_dir, verbose=2, extra_callbacks=()):
    """Stage 1: train the set-up's backbone with GAP + Dense on the base classes; returns the seconds it took."""
    start = time.time()
    fit(setup.classifier, setup.pretrain_data, epochs=setup.spec.recipe.pretrain_epochs,
        callbacks=standard_callbacks(out_dir) + list(extra_callbacks), verbose=verbose)
    setup.model.get_layer("backbone").save_weights(os.path.join(out_dir, PRETRAINED_FILE))
    return time.time() - start


def train(name, out_dir, epochs=None, batch_size=None, limit=None, seed=None, episodes=None, pretrained=None,
          verbose=2, strategy="auto", tensorboard=None, dataset=None, image_size=None, data_dir=None,
          recipe_overrides=None, command=None):
    """Train few-shot preset ``name`` by its recipe; returns the card (also in ``out_dir/metadata.json``, with
    ``config.json`` and ``model.weights.h5``).

    ``epochs``: pre-training epochs; ``episodes``: meta-training episodes; ``batch_size``, ``seed``: the recipe's
    overrides (``recipe_overrides``: any other recipe fields); ``limit``: read only the first ``limit`` images of
    the base classes' source split (before the class filter); ``dataset``: a name of
    ``training.data.datasets.DATASETS`` instead of the preset's, trained on its few-shot class split (``image_size``,
    ``data_dir``: its TFDS images' side and folder); ``pretrained``: skip pre-training and start from the backbone
    another run of this recipe pre-trained (its run directory or its ``pretrained_backbone.weights.h5``); the run's
    pre-training fields (:data:`PRETRAINING_FIELDS`: ``epochs``, ``batch_size``, ...) are then those that run
    recorded (its ``run.json``; the preset's without one), which the card states, and an override of one to
    another value is refused (``ValueError`` naming it). ``command``: the card's ``command``, by default
    the ``otzoo train`` command of these arguments (``--out out_dir`` among them); ``otzoo train`` gives the one it
    ran as.
    """
    overrides = merged_overrides(recipe_overrides, pretrain_epochs=epochs, batch_size=batch_size, seed=seed,
                                 meta_episodes=episodes)
    spec = preset_spec(name, dataset=dataset, image_size=image_size, **overrides)
    if pretrained is not None:  # the card states the pre-training the backbone had, not the preset's
        reference = pretraining_fields(pretrained, preset_spec(name, dataset=dataset, image_size=image_size).recipe)
        check_pretraining_fields(spec.recipe, overrides, reference)
        spec = spec.with_recipe(**reference)
    recipe = spec.recipe
    pretrained_file = pretrained_backbone_path(pretrained) if pretrained is not None else None
    # One replica: meta-training takes one episode a step (TensorFlow: the current strategy, the default one).
    single_replica = ("one_device" if strategy == "one_device" or keras.backend.backend() != "tensorflow"
                      else current_strategy())
    strategy, _, _, extra_callbacks = run_options(name, single_replica, None, tensorboard)
    setup = training_setup(spec, limit=limit, strategy=strategy, data_dir=data_dir)
    model = setup.model
    pretrain_time, extra = 0.0, {}
    if pretrained_file is not None:  # before the run directory is claimed: a file that does not load leaves none
        try:
            model.get_layer("backbone").load_weights(pretrained_file)
        except (ValueError, OSError) as error:  # another model's weights, or no weights file (h5py's OSError)
            raise PresetFormatError(f"`pretrained` {pretrained_file!r} is not the pre-trained backbone of a "
                                    f"{spec.name} run ({PRETRAINED_FILE}): {str(error).splitlines()[0]}") from error
        extra["pretrained_from"] = str(pretrained)
    claim_run_directory(out_dir, run_identity(spec, limit=limit, pretrained=pretrained_file),
                        state=("backup", PRETRAINED_FILE, META_CHECKPOINTS))
    if pretrained_file is None:  # else loaded above
        own_pretrained = os.path.join(out_dir, PRETRAINED_FILE)
        if os.path.isfile(own_pretrained):  # a resumed run: pre-training finished before
            try:
                model.get_layer("backbone").load_weights(own_pretrained)
            except (ValueError, OSError) as error:  # cut short or overwritten (h5py's OSError)
                raise PresetFormatError(f"`out_dir` {out_dir!r}: its {PRETRAINED_FILE} does not load into the "
                                        f"backbone: {str(error).splitlines()[0]}; delete it to pre-train again") \
                    from error
        else:
            pretrain_time = pretrain_backbone(setup, out_dir, verbose, extra_callbacks)
    start = time.time()
    history = meta_train(model, setup.images, setup.labels, recipe.meta_episodes, setup.meta_optimizer, recipe.ways,
                         recipe.shots, recipe.queries, seed=recipe.seed,
                         checkpoint_dir=os.path.join(out_dir, META_CHECKPOINTS), jit_compile=recipe.jit_compile,
                         verbose=verbose)
    train_time = pretrain_time + time.time() - start
    metrics, _ = few_shot_scores(model, spec, verbose=verbose, data_dir=data_dir)
    if command is None:
        command = reproducing_command(name, recipe_overrides, out=out_dir, dataset=dataset, image_size=image_size,
                                      epochs=epochs, batch_size=batch_size, limit=limit, seed=seed, episodes=episodes,
                                      pretrained=pretrained)
    return write_preset(model, spec, out_dir, recipe, metrics, train_time, strategy, command,
                        limit=limit, meta_training=history, **extra,
                        evaluation=f"{recipe.eval_episodes} episodes per setting of the novel classes' images, "
                                   f"{recipe.eval_queries} queries per class, episode seed {recipe.eval_seed}; mean "
                                   "query accuracy +- 1.96 std / sqrt(episodes)")


def evaluate(preset, weights=None, limit=None, episodes=None, data_dir=None):
    """Few-shot accuracies of preset ``preset`` (a name: pretrained, or ``weights``; or a preset directory ``otzoo
    train`` wrote) on its card's novel-class episodes, next to the card's: ``{"metrics", "card_metrics",
    "examples"}``."""
    model, spec, card = evaluation_target(preset, weights)
    metrics, examples = few_shot_scores(model, spec, limit=limit, episodes=episodes, data_dir=data_dir)
    return dict(metrics=metrics, card_metrics=card.get("metrics"), examples=examples)


class MetaTrainingModel(keras.Model):
    """A few-shot model as :func:`meta_train` fits it: the same inputs and logits, trained by the compiled loss
    alone. The backbone's L2 penalty (``zoo.build(..., l2=...)``) belongs to pre-training, and meta-training's
    objective is the episodes' query cross-entropy, as the presets were meta-trained; ``model.fit`` on the few-shot
    model itself would add the penalty."""

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.few_shot = model
        self.built = model.built

    def call(self, inputs, training=False):
        return self.few_shot(list(inputs), training=training)

    @property
    def losses(self):
        return []


def meta_train(model, images, labels, episodes, optimizer, ways=5, shots=1, queries=15, seed=0, checkpoint_dir=None,
               checkpoint_every=100, jit_compile=True, log_every=50, verbose=1):
    """Episodic meta-training of a few-shot model (``zoo.few_shot_model``: inputs ``[query_images, support_images,
    support_labels]``, logits ``(queries * ways, ways)``) by cross-entropy on the query labels, one episode a step,
    on every Keras backend (Keras' own training step, ``train_on_batch``; ``jit_compile`` as a recipe's: XLA on
    TensorFlow and JAX, eager on PyTorch). The backbone's weight penalties are left out (:class:`MetaTrainingModel`).

    Episode ``i`` is ``EpisodeBatches(images, labels, episodes, ways, shots, queries, seed)[i]`` (raw pixels, as the
    model takes them). With ``checkpoint_dir`` the model's weights, the optimizer's state, the episode count and
    the history so far (each episode's loss and accuracy, the signals logged) are backed up every
    ``checkpoint_every`` episodes and at the end (``training.distributed.checkpoints.save_weights_backup``: written
    to a temporary directory, then renamed), and a new call resumes after the last backed-up episode, drawing the
    episodes an uninterrupted run would. Returns ``{"episode": [...], "loss": [...], "accuracy": [...]}``: means
    over each ``log_every`` episodes (and the last ones); for a model with an ``EMDHead``, also its solver's signals
    at each of those episodes (``ot_layers.callbacks.layer_signals.LayerSignals`` on the first episode, in
    inference mode: ``emd_head_marginal_error``, ``emd_head_converged`` and, with Sinkhorn,
    ``emd_head_sinkhorn_iterations``). The history is the whole run's, also when resumed (the backed-up episodes'
    from the backup), as an uninterrupted run's would be; only a backup of an earlier otzoo, which kept no history,
    leaves its episodes out.
    """
    batches = EpisodeBatches(images, labels, episodes, ways, shots, queries, seed)
    checkpoint_every = check_positive_int("checkpoint_every", checkpoint_every)
    log_every = check_positive_int("log_every", log_every)
    trained = MetaTrainingModel(model)
    trained.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=["accuracy"], jit_compile=compiled_step(jit_compile))
    done, records, logged = 0, [], {}
    if checkpoint_dir is not None:
        check_checkpoint_format(checkpoint_dir)
        progress = load_weights_backup(trained, checkpoint_dir, name="checkpoint_dir")
        done = progress["episodes"] if progress is not None else 0
        records, logged = _recorded_episodes(progress)
    signals = LayerSignals(list(batches[0][0]))
    signals.set_model(model)
    known = done - len(records)  # episodes of a backup written before backups recorded them: not in the history
    window = records[max(0, _last_log_point(done, log_every, batches.episodes) - known):]
    for index in range(done, batches.episodes):
        inputs, query_labels = batches[index]
        logs = trained.train_on_batch(inputs, query_labels, return_dict=True)
        records.append([float(logs["loss"]), float(logs["accuracy"])])
        window.append(records[-1])
        if (index + 1) % log_every == 0 or index + 1 == batches.episodes:
            mean_loss, mean_accuracy = np.mean(window, axis=0)
            found = signals.signals()
            logged[index + 1] = {name: float(value) for name, value in found.items()}
            window = []
            if verbose:
                print(f"episode {index + 1}/{batches.episodes}: loss {mean_loss:.4f}, query accuracy "
                      f"{mean_accuracy:.4f}" + "".join(f", {name} {value:.4g}" for name, value in found.items()),
                      flush=True)
        if checkpoint_dir is not None and ((index + 1) % checkpoint_every == 0 or index + 1 == batches.episodes):
            save_weights_backup(trained, checkpoint_dir, f"episodes-{index + 1:07d}",
                                {"episodes": index + 1, "records": records,
                                 "signals": [[episode, values] for episode, values in sorted(logged.items())]})
    return _meta_history(records, known, logged, log_every, batches.episodes)


def _recorded_episodes(progress):
    """``(per-episode [loss, accuracy], {logged episode: the layers' signals})`` a meta-training backup's
    ``progress`` holds (empty for none, or for a backup of an earlier otzoo that recorded only the episode count)."""
    if progress is None or not isinstance(progress.get("records"), list):
        return [], {}
    return ([list(map(float, record)) for record in progress["records"]],
            {int(episode): dict(values) for episode, values in progress.get("signals", [])})


def _log_points(episodes, log_every):
    """The episodes after which a run of ``episodes`` logs: every ``log_every``-th and the last."""
    return sorted(set(range(log_every, episodes + 1, log_every)) | ({episodes} if episodes else set()))


def _last_log_point(done, log_every, episodes):
    """The last episode up to ``done`` after which a run of ``episodes`` logs (0: none)."""
    return max([point for point in _log_points(episodes, log_every) if point <= done], default=0)


def _meta_history(records, known, logged, log_every, episodes):
    """:func:`meta_train`'s history from the per-episode ``records`` of episodes ``known + 1 ..`` and the signals
    ``logged`` at log points: at each log point of a run of ``episodes`` (those whose window lies before ``known``,
    the episodes an earlier otzoo's backup did not record, left out) the mean loss and accuracy since the previous
    one, and the signals recorded there (``None`` where a resumed run logged at other episodes)."""
    history = {"episode": [], "loss": [], "accuracy": []}
    names = list(dict.fromkeys(name for _, values in sorted(logged.items()) for name in values))
    previous = 0
    for point in _log_points(episodes, log_every):
        if point > known + len(records):
            break
        if point > known:
            mean_loss, mean_accuracy = np.mean(records[max(previous, known) - known:point - known], axis=0)
            history["episode"].append(point)
            history["loss"].append(float(mean_loss))
            history["accuracy"].append(float(mean_accuracy))
            for name in names:
                history.setdefault(name, []).append(logged.get(point, {}).get(name))
        previous = point
    return history


def check_checkpoint_format(checkpoint_dir):
    """Meta-training's backups are Keras weight files; a ``tf.train`` checkpoint (what otzoo's meta-training wrote
    before it ran on every backend) cannot be resumed from: one line naming ``checkpoint_dir``."""
    if os.path.isfile(os.path.join(checkpoint_dir, "checkpoint")) and not os.path.isfile(
            os.path.join(checkpoint_dir, POINTER_FILE)):
        raise ValueError(f"`checkpoint_dir` {checkpoint_dir!r} holds a tf.train checkpoint of an earlier otzoo's "
                         "meta-training, which this version does not resume from; resume the run with that version, "
                         "or delete the directory to meta-train again from the pre-trained backbone.")


def check_evaluation_limit(spec, limit):
    """``otzoo evaluate --limit`` of few-shot preset ``spec`` on Fashion-MNIST: the novel classes among the first
    ``limit`` test images must supply its evaluation episodes (``ways`` classes with the largest shot count plus
    the queries each), else :class:`EmptySliceError` naming ``limit``, before the model is loaded. Other data sets
    are checked as they are read."""
    if limit is None or spec.data.dataset != "fashion_mnist":
        return
    _, labels = fashion_mnist_split("few_shot", "novel", limit=limit, normalize=False)
    counts, held = evaluation_slice(limit, labels)
    recipe, ways = spec.recipe, spec.architecture.ways
    needed = max(recipe.eval_shots) + recipe.eval_queries
    if np.sum(counts >= needed) < ways:
        raise EmptySliceError(f"{held}; {ways}-way {max(recipe.eval_shots)}-shot episodes with {recipe.eval_queries} "
                              f"queries need {ways} classes of {needed} images or more; give more test images",
                              "limit", limit)


def fine_tune_setup(spec, model, limit, seed, batch_size, queries):
    """What ``otzoo fine-tune`` fits for few-shot preset ``spec`` (a spec or a name; a preset directory's spec carries
    its card's recipe): a :class:`FineTuneSetup` (model, its loss, its training data, the same episodes to evaluate on,
    what an epoch fits in words): the served few-shot ``model`` (pretrained) itself, by cross-entropy on the query
    labels, on about one pass over the first ``limit`` Fashion-MNIST base-class training images in ``ways``-way 1-shot
    episodes with ``queries`` queries per class (``seed``). ``batch_size``: unused (one episode is one batch). Raises
    :class:`EmptySliceError` naming ``limit`` when they cannot supply an episode (``ways`` base classes with ``1 +
    queries`` images each)."""
    spec = preset_spec(spec)
    images, labels = fashion_mnist_split("few_shot", "base", limit=limit, normalize=False, relabel=True)
    ways, needed = spec.architecture.ways, 1 + queries
    counts = np.bincount(labels, minlength=ways)
    if np.sum(counts >= needed) < ways:
        raise EmptySliceError(
            f"{len(images)} base-class training images, {int(np.sum(counts >= needed))} base class(es) with "
            f"{needed} images or more; a {ways}-way episode needs {ways} (per class: {counts.tolist()}); "
            "give more images", parameter="limit", value=limit)
    episodes = max(1, len(images) // (ways * (1 + queries)))  # about one pass over the images
    among = "" if limit is None else f" among the first {limit:,}"
    fitted = (f"{episodes:,} {ways}-way 1-shot episodes of {queries} queries per class drawn from the "
              f"{len(images):,} base-class training images{among}")
    episode_batches = EpisodeBatches(images, labels, episodes, ways=ways, shots=1, queries=queries, seed=seed)
    # an episode depends on its index alone: the same episodes are fitted on and evaluated on
    return FineTuneSetup(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True), episode_batches,
                         episode_batches, fitted)
