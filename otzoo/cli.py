"""The ``otzoo`` command line: ``list``, ``train``, ``evaluate``, ``fine-tune``, ``demo``, and ``explain``,
``export``, ``tune`` from their own modules (each defines ``register(commands, parser_class)`` and sets ``run`` on
its sub-parser).

:func:`main` returns the exit status. Bad input (an unknown preset, a non-positive count, an empty data slice, a
missing file) ends in one line naming the option and exit status 2 (:class:`otzoo.arguments.CommandError`). A
cluster this process cannot join (its ``TF_CONFIG`` address in use:
``training.distributed.strategies.ClusterStartError``) ends in one line and exit status 1, a failure a relaunch can
mend (``otzoo train --workers N`` relaunches its workers on new ports). Any other error is a bug and keeps its
traceback (exit status 1).
"""
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings

import keras
import numpy as np

import export
import zoo
from otzoo import BACKENDS, explain_command, export_command, tune_command
from ot_layers.optional import MissingExtraError
from otzoo.arguments import (
    ArgumentParser,
    DEMO_PRESET,
    CommandError,
    default_output_directory,
    directory_preset,
    new_preset_directory,
    output_directory,
    packaged_weights_note,
    positive_int,
    positive_number,
    preset_name,
    preset_or_directory,
    recipe_item,
    seed_value,
    weights_location,
)
from training.data.datasets import DATASETS
from training.data.errors import DataUnavailableError, EmptySliceError
from training.data.fashion_mnist import load_fashion_mnist
from training.data.pipelines import array_batches
from training.distributed.checkpoints import OtherTrainerError
from training.distributed.keras_distribution import UnevenSplitError
from training.distributed.launch import SCRATCH_ENV, run_cluster
from training.distributed.strategies import ClusterStartError, tf_config, uses_multi_worker
from training.recipes import RECIPES, evaluate_preset, recipe_for, train_preset
from training.recipes.common import card_spec, fine_tune_images, preset_spec, reproducing_command
from training.recipes.components import RecipeError, compiled_step
from training.recipes.few_shot import META_CHECKPOINTS, check_checkpoint_format, pretrained_backbone_path
from training.recipes.fine_tune import (BATCH_SIZE as FINE_TUNE_BATCH, fine_tune_preset, fine_tune_source,
                                       fine_tuned_card)
from training.recipes.run_directory import (MODEL_FIT, MULTI_WORKER_LOOP, RUN_FILE, TRAINING_STATE,
                                            ResumeMismatchError, held_state, read_mark, trainer_mismatch)
from training.recipes.tuned_config import check_tuned_head, load_tuned_config
from zoo.loading import ShadowedPresetWarning
from zoo.preset_format import (CARD_FILE, MissingWeightsError, PresetFormatError, WeightsDownloadError,
                               WeightsIntegrityError, output_directory_problem, read_card)
from zoo.registry import PRESETS


# The command `otzoo train --workers N` ran as, given to its workers: the chief records it on the card (theirs is
# the launcher's relaunch, --strategy multi_worker --resume), and none of them says there is nothing to resume (the
# launcher's --resume, not the user's: the launcher said so if the user's).
COMMAND_ENV = "OTZOO_TRAIN_COMMAND"


def _format_metric(value):
    if isinstance(value, dict) and "mean" in value:  # a few-shot mean with its 95 % interval
        return f"{value['mean']:.4f} +- {value['ci95']:.4f}"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _headline(metrics, keys=2):
    """The first ``keys`` metrics of a card, one line."""
    if not metrics:
        return "not trained yet"
    return ", ".join(f"{key} {_format_metric(value)}" for key, value in list(metrics.items())[:keys])


def list_presets(args):
    """Print the presets with their task and headline metric."""

    names = zoo.list_models(args.task)
    width = max(len(n) for n in names) if names else 10
    for name in names:
        card = zoo.model_card(name)
        print(f"{name:<{width}}  {card['task']:<14}  {_headline(card.get('metrics'))}")
    return 0


def train(args):
    """Train a preset by its recipe; writes a preset directory into --out (config.json, model.weights.h5,
    metadata.json: the card with the task, data set, split, the recipe that ran, metrics, sha256 of the weights)
    and log.csv. --dataset trains the preset's architecture and recipe on another data set (fashion_mnist from its
    IDX files, the others through TFDS, prepared on this machine): its input shape, classes and, for retrieval and
    few-shot presets, its class split; --image-size sets the TFDS images' side. --recipe FIELD=VALUE overrides any
    recipe field (VALUE in JSON, e.g. --recipe optimizer=adam --recipe 'callbacks=[]').

    On TensorFlow it runs under a tf.distribute strategy (--strategy; auto: all local GPUs, else the CPU, or the
    workers TF_CONFIG names). --workers N starts N local worker processes on 127.0.0.1 (each with its TF_CONFIG)
    running this command with --strategy multi_worker (another --strategy beside --workers is refused); on a real
    cluster, start the command on every host with its TF_CONFIG instead. On JAX and PyTorch (otzoo --backend jax
    train ...) classification and retrieval presets train with model.fit (--strategy auto: JAX spreads each batch
    over all local devices with keras.distribution; one_device: one device), few-shot presets pre-train with
    model.fit and meta-train one episode a step on one device, and the card records the backend.
    A run killed before it finished resumes from its training state in --out with --resume (backup/; a few-shot
    run's pre-trained backbone and meta-training checkpoints too), given the options it was started with (--out's
    run.json records them, and whether it trained on workers: a run begun with --workers resumes with it, one begun
    without resumes without; other options stop with an error naming the fields that differ). With --resume and no
    training state in --out, one line on stderr says so and the run starts from scratch: the same command starts a
    run and restarts it after a kill (a job script, a preemptible machine), and the line names the directory, so a
    mistyped --out shows at once. The --out of a finished run (its card there, metadata.json) is refused, --resume
    or not: choose another, or delete it to train again. The card records the command that repeats the run: the
    preset and the options given (--out, the default one too; --workers, --strategy; not --resume).
    """

    task = PRESETS[args.preset].task
    out = args.out or default_output_directory(os.path.join("otzoo_runs", args.preset))
    overrides = _recipe_overrides(args.recipe)
    try:  # every recipe field and name checked before anything is read or built
        preset_spec(args.preset, dataset=args.dataset, image_size=args.image_size, **overrides)
    except ValueError as error:
        given = [flag for flag, value in (("--dataset", args.dataset), ("--image-size", args.image_size),
                                          ("--recipe", args.recipe)) if value is not None]  # one at least: it failed
        raise CommandError(f"{'/'.join(given)}: {error}") from None
    _check_data_dir(args.data_dir, args.dataset or PRESETS[args.preset].data.dataset)
    _check_cluster(args)
    options = dict(epochs=args.epochs, batch_size=args.batch_size, limit=args.limit, seed=args.seed, verbose=2,
                   strategy=args.strategy, tensorboard=args.tensorboard, dataset=args.dataset,
                   image_size=args.image_size, data_dir=args.data_dir, recipe_overrides=overrides)
    # The options only some tasks' recipes take (each recipe module's TRAIN_OPTIONS): refused for the others.
    accepted = recipe_for(task).TRAIN_OPTIONS
    task_options = {"episodes": args.episodes, "pretrained": args.pretrained, "config": args.config}
    _refuse_options(task_options, accepted, "TRAIN_OPTIONS", args.preset, task)
    options.update({key: value for key, value in task_options.items() if key in accepted})
    if args.config is not None:  # accepted by the preset's task: a readable tuning result for this preset
        try:
            tuned = load_tuned_config(args.config, args.preset)
            # whether the head builds: not in a multi-worker process, whose strategy must come before any model
            if args.workers > 1 or (args.strategy != "multi_worker" and not os.environ.get("TF_CONFIG")):
                check_tuned_head(args.config, tuned, args.preset)
        except (FileNotFoundError, ValueError) as error:
            raise CommandError(f"--config: {error}") from None
    if args.pretrained is not None:  # accepted by the preset's task: the file must be there before training
        try:
            pretrained_backbone_path(args.pretrained)
        except FileNotFoundError as error:
            raise CommandError(f"--pretrained: {error}") from None
    state = held_state(out, [entry for entry in TRAINING_STATE if entry != "tuner"])
    # A card without training state is a finished run (or a saved preset): a new run would replace its weights and
    # card and append to its log. A finished few-shot run keeps its state beside its card: --resume would train
    # nothing and rewrite the card. (A card beside a backup/ is an unfinished run's: it resumes.)
    if os.path.isfile(os.path.join(out, CARD_FILE)) and (task == "few_shot" or not state):
        kept = f", and its {', '.join(state)}" if state else ""
        raise CommandError(f"--out {out} holds a finished run ({CARD_FILE}{kept}); choose another --out, or delete "
                           "the directory to train again.")
    if state and not args.resume:  # backup/; a few-shot run's pre-trained backbone and meta-training checkpoints
        raise CommandError(f"--out {out} holds a run's training state ({', '.join(state)}); pass --resume to "
                           "continue from it, or choose another --out.")
    if args.resume and "backup" in state:  # a backup another trainer wrote: refused before any work
        mismatch = trainer_mismatch(read_mark(os.path.join(out, RUN_FILE)), _trainer(args, task))
        if mismatch:
            raise CommandError(f"--out {out}: {mismatch}")
    if args.resume and task == "few_shot":  # a meta-training checkpoint of an earlier otzoo: one line, not at its end
        try:
            check_checkpoint_format(os.path.join(out, META_CHECKPOINTS))
        except ValueError as error:
            raise CommandError(f"--out: {error}") from None
    launched = os.environ.get(COMMAND_ENV)  # a worker of `otzoo train --workers N`: its launcher's command
    if args.resume and not state and not launched:  # the launcher has said so; its workers' --resume is its own
        print(f"otzoo {args.command}: --resume: no training state in {out} to resume from; training from scratch",
              file=sys.stderr, flush=True)
    command = launched or _train_command(args, out, overrides)
    if args.workers > 1:
        return _train_on_local_workers(args, out, command)

    card = train_preset(args.preset, out, command=command, **options)
    print(f"{args.preset}: {_headline(card['metrics'])}; {card['train_time_s']:.0f} s of training; weights and card "
          f"in {out}")
    return 0


def _train_command(args, out, overrides):
    """The ``otzoo train`` command that repeats the run of ``args`` into ``out``, for its card: the preset, ``--out``
    (the one in effect, the default too), the options given (``--workers`` and ``--strategy`` when not their
    defaults) and ``--recipe`` for each of ``overrides``; ``--resume`` left out (a repeat starts afresh)."""
    return reproducing_command(
        args.preset, overrides, out=out, dataset=args.dataset, image_size=args.image_size, epochs=args.epochs,
        batch_size=args.batch_size, limit=args.limit, seed=args.seed, episodes=args.episodes,
        pretrained=args.pretrained, config=args.config, workers=args.workers if args.workers > 1 else None,
        strategy=None if args.strategy == "auto" else args.strategy, tensorboard=args.tensorboard,
        data_dir=args.data_dir)


def _task_words(task):
    return task.replace("_", "-")


def _refuse_options(values, accepted, table, preset, task):
    """Raise :class:`CommandError` for the options of ``values`` (``{option: value or None}``) given (not ``None``)
    that preset ``preset``'s ``task`` does not accept (``accepted``: its recipe module's ``table``,
    ``TRAIN_OPTIONS`` or ``EVALUATE_OPTIONS``), naming them, the tasks whose presets take them, and ``task``."""
    refused = [key for key, value in values.items() if value is not None and key not in accepted]
    if not refused:
        return
    takers = [_task_words(name) for name, recipe in RECIPES.items() if set(refused) <= set(getattr(recipe, table))]
    flags = ", ".join(f"--{key.replace('_', '-')}" for key in refused)
    verb = "applies" if len(refused) == 1 else "apply"
    where = f"{' and '.join(takers)} presets only" if takers else "no preset's task"
    raise CommandError(f"{flags} {verb} to {where}; {preset} is a {_task_words(str(task))} preset.")


def _recipe_overrides(items):
    """``{field: value}`` from ``--recipe FIELD=VALUE`` options (checked by :func:`otzoo.arguments.recipe_item`;
    VALUE read as JSON, else as a string)."""
    overrides = {}
    for item in items or ():
        field, _, text = item.partition("=")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        overrides[field.strip()] = tuple(value) if isinstance(value, list) else value
    return overrides


def _train_on_local_workers(args, out, command):
    """This command again in ``args.workers`` local processes with ``--strategy multi_worker`` (this process does
    not start TensorFlow), each given ``command``, the one the card records, as ``$OTZOO_TRAIN_COMMAND``
    (:data:`COMMAND_ENV`).

    The chief (worker 0) writes the preset into ``out`` and its output is shown here as it trains; the other
    workers, which must save too, write into a temporary folder (``$OTZOO_WORKER_SCRATCH``) removed at the end, so
    ``out`` holds the chief's files only. Every worker's full log stays in ``out/workers/attempt-<k>/``. Workers that
    failed on bad input (exit status 2) end in their one-line error; any other failure in exit status 1 naming
    the logs."""

    workers = [sys.executable, "-m", "otzoo"] + _without_options(args.argv, {"--workers": 1, "--strategy": 1})
    workers += ["--strategy", "multi_worker", "--out", out, "--resume"]
    logs = os.path.join(out, "workers")
    scratch = tempfile.mkdtemp(prefix="otzoo-workers-")
    print(f"{args.preset}: training on {args.workers} local workers; the chief's output follows (every worker's log "
          f"in {logs})", flush=True)
    try:
        attempts = run_cluster(workers, args.workers, logs, max_restarts=1, final_codes=(2,),  # 2: refused input
                               env={SCRATCH_ENV: scratch, COMMAND_ENV: command}, echo=0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    # An attempt whose chief finished wrote the card: a relaunch after it (another worker failed) refuses the
    # finished run's --out, so that attempt, not the refusal, is the run's result.
    results = next((attempt for attempt in attempts if any(r.index == 0 and r.returncode == 0 for r in attempt)),
                   attempts[-1])
    failed = [r for r in results if r.returncode != 0]
    if failed:
        where = ", ".join(r.log_path for r in failed)
        if all(r.returncode == 2 for r in failed):  # the workers refused the input: their one line
            raise CommandError(f"{_error_line(failed[0])} (worker log(s): {where})")
        print(f"otzoo {args.command}: worker(s) {', '.join(str(r.index) for r in failed)} failed (exit status "
              f"{', '.join(str(r.returncode) for r in failed)}); see {where}", file=sys.stderr)
        return 1
    print(f"{args.preset}: trained on {args.workers} local workers; weights and card in {out} (logs in {logs})")
    return 0


def _error_line(result):
    """The ``error:`` line a worker printed (what follows ``error: ``), or a pointer to its log."""
    lines = [line for line in result.output().splitlines() if ": error: " in line]
    return lines[-1].split(": error: ", 1)[1] if lines else f"worker {result.index} refused its input"


def _without_options(argv, options):
    """``argv`` without the given ``--option`` flags and their values (``{flag: number of values}``)."""
    kept, skip = [], 0
    for item in argv:
        if skip:
            skip -= 1
            continue
        flag = item.split("=", 1)[0]
        if flag in options:
            skip = 0 if "=" in item else options[flag]
            continue
        kept.append(item)
    return kept


def evaluate(args):
    """Recompute a preset's card metrics on the real test split (the unseen or novel classes' test images for
    retrieval and few-shot presets) and compare them with the card. PRESET: a preset name, or a preset directory
    (evaluated by the recipe of the preset its card names, with its own weights checked against its card). With
    --weights, the card compared with is the one that comes with those weights (their preset directory's
    metadata.json); weights without one (a lone weights file, a URL) are compared with nothing, since the packaged
    card describes the packaged weights."""

    name, weights = args.preset, args.weights
    card = None if name in PRESETS else (read_card(name) or {})  # a preset directory's, read once
    task = PRESETS[name].task if card is None else card.get("task")
    if task is not None and not isinstance(task, str):  # a card is the user's input (a list is no task's name)
        raise CommandError(f"PRESET: the card of {name!r}: `task` must be one of {list(RECIPES)}, got {task!r}.")
    options = dict(data_dir=args.data_dir)
    # The options only some tasks' recipes take (each recipe module's EVALUATE_OPTIONS): refused for the others (a
    # directory whose card states no known task accepts none; directory_preset names the card's problem).
    accepted = RECIPES[task].EVALUATE_OPTIONS if task in RECIPES else ()
    task_options = {"episodes": args.episodes}
    _refuse_options(task_options, accepted, "EVALUATE_OPTIONS", name, task)
    options.update({key: value for key, value in task_options.items() if value is not None})
    if card is not None:  # a preset directory: evaluated on its card's data set, class split and recipe
        if weights is not None:
            raise CommandError("--weights: a preset directory is evaluated with its own weights; give a preset "
                               "name with --weights, or the directory alone.")
        directory_preset(name, card)
        try:  # the card's data set, input shape and recipe, which the directory is evaluated by
            card_spec(card)
        except ValueError as error:
            raise CommandError(f"PRESET: the card of {name!r}: {error}") from None
        _check_data_dir(args.data_dir, card.get("dataset"))  # the card's: what it is evaluated on
    else:
        _check_data_dir(args.data_dir, PRESETS[name].data.dataset)
    # evaluate_preset refuses a --limit too small for the task's metrics in one line, before the model loads
    result = evaluate_preset(name, weights=weights, limit=args.limit, **options)
    card_metrics = result["card_metrics"] or {}
    for key, value in result["metrics"].items():
        stated = f" (card: {_format_metric(card_metrics[key])})" if key in card_metrics else ""
        print(f"{args.preset}: {key} {_format_metric(value)}{stated} on {result['examples']:,} test images")
    if weights is not None and not card_metrics:  # the packaged card describes other weights
        print(f"{args.preset}: no card with metrics comes with --weights {weights}; nothing to compare with")
    return 0


def _check_cluster(args):
    """``TF_CONFIG`` readable where it is set, and there when ``--strategy multi_worker`` runs without ``--workers``
    (each worker of a cluster is started with its own)."""
    try:
        config = tf_config()
    except ValueError as error:
        raise CommandError(str(error)) from None
    if args.strategy == "multi_worker" and args.workers == 1 and config is None:
        raise CommandError("--strategy multi_worker: needs the TF_CONFIG environment variable describing the cluster "
                           "(see docs/distributed.md), or --workers N to start N local workers.")
    if args.workers > 1 and args.strategy not in ("auto", "multi_worker"):  # the workers run multi_worker
        raise CommandError(f"--strategy {args.strategy}: --workers {args.workers} trains under multi_worker (every "
                           "worker's strategy); leave --strategy out, or give --strategy multi_worker.")


def _trainer(args, task):
    """What trains ``otzoo train``'s run of ``args`` and writes its ``backup/``, as ``run.json`` records it
    (``training.recipes.run_directory.current_trainer``): the multi-worker loop under ``MultiWorkerMirroredStrategy``
    (``--workers N``, ``--strategy multi_worker``, or ``auto`` with a ``TF_CONFIG`` of several workers; not for
    few-shot presets, which pre-train on one replica), else ``model.fit``."""
    if task == "few_shot" or keras.backend.backend() != "tensorflow":
        return MODEL_FIT
    return MULTI_WORKER_LOOP if uses_multi_worker(args.strategy, args.workers) else MODEL_FIT


def _check_data_dir(data_dir, dataset):
    """``--data-dir`` names where TFDS keeps its data sets: given for Fashion-MNIST (read from its IDX files), it
    would be ignored without a word."""
    if data_dir is not None and dataset == "fashion_mnist":
        raise CommandError("--data-dir: applies to TFDS data sets; Fashion-MNIST is read from its IDX files "
                           "(/usr/share/datasets/fashion-mnist, or the folder $OTZOO_FASHION_MNIST names).")


def fine_tune(args):
    """Load a pretrained preset, or a preset directory (an otzoo train run, an earlier fine-tuning run), fit it with
    model.fit on a slice of its training data by its recipe's loss, and save the result as a preset directory
    (config.json, model.weights.h5, metadata.json, whose card keeps the runs before) that zoo.load, otzoo evaluate,
    otzoo export and otzoo explain read. The training images are Fashion-MNIST's: a preset of another data
    set is refused."""

    try:  # the directory's card (the preset it comes from, its recipe) and the data set, before any work
        fine_tune_source(args.preset)
    except ValueError as error:
        raise CommandError(f"PRESET: {error}") from None
    card = fine_tune_preset(args.preset, args.out, epochs=args.epochs, limit=args.limit,
                            learning_rate=args.learning_rate, seed=args.seed)
    tuned = card["fine_tuned"]
    losses = ", ".join(f"{value:.4f}" for value in tuned["loss"])
    before, after = tuned["loss_on_slice_before_after"]
    # what an epoch fitted: the images of full batches (an incomplete last one is dropped), not --limit's count
    print(f"{args.preset}: fine-tuned {args.epochs} epoch(s) on {tuned['fitted']} with the {tuned['backend']} "
          f"backend (loss per epoch: {losses}; on the slice {before:.4f} before, {after:.4f} after); saved to "
          f"{args.out}")
    return 0


def demo(args):
    """Load the pretrained resnet20_mpw_fashion_mnist, evaluate it, fine-tune it for one epoch, export it as a TF
    Serving SavedModel and check the export in a fresh process (a new version in OUT/saved_model beside any earlier
    one). On JAX and PyTorch the fine-tuned model is saved as a preset directory OUT/fine_tuned instead, with the
    command that exports it on TensorFlow (the SavedModel and ONNX converters are TensorFlow's); an OUT/fine_tuned
    that holds a preset already is refused before any work, as otzoo fine-tune refuses one."""
    if args.limit < FINE_TUNE_BATCH:  # one batch of training images at least (an incomplete one is dropped)
        raise CommandError(f"--limit {args.limit}: fewer than one batch of {FINE_TUNE_BATCH} training images to "
                           f"fine-tune on (an incomplete batch is dropped); give {FINE_TUNE_BATCH} or more")
    output = "saved_model" if keras.backend.backend() == "tensorflow" else "fine_tuned"
    # Before the work whose result it would hold. A SavedModel goes to a new version beside any earlier one; the
    # fine-tuned preset of JAX and PyTorch must not replace an earlier one (as otzoo fine-tune refuses to).
    problem = output_directory_problem(os.path.join(args.out, output), new_preset=output == "fine_tuned")
    if problem:
        raise CommandError(f"--out: {problem}.")
    name = DEMO_PRESET
    keras.utils.set_random_seed(args.seed)
    start = time.time()
    model = zoo.load(name)
    card = zoo.model_card(name)
    print(f"1. zoo.load({name!r}): {model.count_params():,} parameters, loaded in {time.time() - start:.1f} s "
          f"(card: test accuracy {card['metrics']['accuracy']:.4f})")
    x_test, y_test = load_fashion_mnist("test", normalize=False)
    x_test, y_test = x_test[:args.test_limit], y_test[:args.test_limit]
    model.compile(optimizer=keras.optimizers.SGD(args.learning_rate, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                  jit_compile=compiled_step(True))
    _, before = model.evaluate(array_batches(x_test, y_test, 256), verbose=0)
    print(f"2. model.evaluate on {len(x_test):,} Fashion-MNIST test images (raw 0-255 pixels): accuracy {before:.4f}")
    x_train, y_train = load_fashion_mnist("train", limit=args.limit, normalize=False)
    # shuffle=False: the batches come in their own seeded order (for a tf.data.Dataset Keras would warn it ignores it)
    fit_start = time.time()
    history = model.fit(array_batches(x_train, y_train, FINE_TUNE_BATCH, training=True, seed=args.seed), epochs=1,
                        verbose=0, shuffle=False)
    fit_time = time.time() - fit_start
    _, after = model.evaluate(array_batches(x_test, y_test, 256), verbose=0)
    fitted = fine_tune_images(len(x_train), FINE_TUNE_BATCH, "training images")  # an incomplete batch is dropped
    print(f"3. model.fit, 1 epoch on {fitted} (loss {history.history['loss'][-1]:.4f}): test accuracy {after:.4f}")
    if keras.backend.backend() != "tensorflow":
        path = os.path.join(args.out, "fine_tuned")
        command = (f"otzoo --backend {keras.backend.backend()} demo --limit {args.limit} --test-limit "
                   f"{args.test_limit} --learning-rate {args.learning_rate} --seed {args.seed} --out {args.out}")
        zoo.save_preset(model, path, card=fine_tuned_card(name, 1, len(x_train), args.learning_rate, args.seed,
                                                          history.history["loss"], fit_time, command=command,
                                                          fitted=fitted))
        print(f"4. zoo.save_preset -> {path}. Export runs on the TensorFlow backend (the SavedModel and ONNX "
              f"converters); where TensorFlow is installed: otzoo --backend tensorflow export {path} --out "
              f"{os.path.join(args.out, 'export')}")
        return 0
    export_dir = export.to_saved_model(model, os.path.join(args.out, "saved_model"))
    report = export.verify(model, x_test[:8].astype(np.float32), saved_model_dir=export_dir)
    print(f"4. export.to_saved_model -> {export_dir}; max |SavedModel - Keras| in a fresh process: "
          f"{report['saved_model']:.2e}")
    return 0


# The errors of the user's input that end in one line and exit status 2 (argparse's own exit 2 before a command
# runs). Nothing else is caught: a plain ValueError, FileNotFoundError or any other exception is a bug (or an
# unforeseen failure) and keeps its traceback, exit status 1.
USER_ERRORS = (CommandError, EmptySliceError, ResumeMismatchError, DataUnavailableError, WeightsIntegrityError,
               MissingWeightsError, WeightsDownloadError, PresetFormatError, MissingExtraError, RecipeError,
               OtherTrainerError, UnevenSplitError)


# Commands built on TensorFlow-only machinery: the SavedModel and ONNX converters (export). ``train`` runs on every
# backend but for the parts named in :func:`check_train_backend`.
TENSORFLOW_COMMANDS = ("export",)


def check_backend(args):
    """``--backend``'s choice is the backend Keras runs on (set before Keras was imported, see ``otzoo/__init__``),
    and the command runs on it; else a :class:`CommandError` naming ``backend``."""
    active = keras.backend.backend()
    if args.backend is not None and args.backend != active:
        raise CommandError(f"backend: Keras already runs on {active} in this process; start otzoo with --backend "
                           f"{args.backend} first on its command line, or set KERAS_BACKEND={args.backend}.")
    if args.command in TENSORFLOW_COMMANDS and active != "tensorflow":
        raise CommandError(f"backend: otzoo {args.command} runs on the TensorFlow backend (the SavedModel and ONNX "
                           f"converters), and Keras runs on {active}. On {active}, use otzoo train, evaluate, "
                           f"fine-tune, tune and explain, or zoo.load and model.fit; weights saved there load on and "
                           f"export from TensorFlow.")
    if args.command == "train" and active != "tensorflow":
        check_train_backend(args, active)


def check_train_backend(args, active):
    """``otzoo train`` on JAX or PyTorch: every preset through Keras' own training steps (classification and
    retrieval: ``model.fit``, on JAX data parallel over all devices by ``keras.distribution``; few-shot: pre-training
    by ``model.fit`` and meta-training one episode a step, on one device); the multi-worker cluster and the
    ``tf.distribute`` strategies are TensorFlow's (a :class:`CommandError` names the option)."""
    if args.workers > 1 or args.strategy not in ("auto", "one_device"):
        option = "--workers" if args.workers > 1 else "--strategy"
        devices = ("every local device through keras.distribution (--strategy auto) or one (--strategy one_device)"
                   if active == "jax" else "one device (--strategy auto or one_device; keras.distribution's data "
                   "parallelism is JAX's)")
        raise CommandError(f"{option}: multi-worker and tf.distribute training run on the TensorFlow backend; on "
                           f"{active} otzoo train uses {devices}.")


@contextlib.contextmanager
def _packaged_weights_noted(args):
    """Around a command that loads a built-in preset by its name where ``./NAME`` is a preset directory too: the
    command's own line (:func:`otzoo.arguments.packaged_weights_note`) on stderr first, in place of ``zoo.load``'s
    warning, which names ``zoo.load('./NAME')``."""
    note = packaged_weights_note(args.command, getattr(args, "preset", None))
    with warnings.catch_warnings():
        if note:
            print(f"otzoo {args.command}: note: {note}", file=sys.stderr)
            warnings.simplefilter("ignore", ShadowedPresetWarning)
        yield


def main(argv=None):
    parser = ArgumentParser(prog="otzoo", description="Optimal-transport and prototype layers for Keras: the model zoo.")
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="the Keras backend (default: KERAS_BACKEND, else the backend of keras.json in "
                             "$KERAS_HOME or ~/.keras, else tensorflow); must come first when "
                             f"otzoo is run as a command; on tensorflow only: {', '.join(TENSORFLOW_COMMANDS)}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=ArgumentParser)

    sub = commands.add_parser("list", help="list the presets with task and headline metric",
                              description=list_presets.__doc__)
    sub.add_argument("--task", choices=list(RECIPES), default=None)
    sub.set_defaults(run=list_presets)

    sub = commands.add_parser("train", help="train a preset by its recipe", description=train.__doc__)
    sub.add_argument("preset", type=preset_name)
    sub.add_argument("--epochs", type=positive_int, default=None,
                     help="default: the recipe's (few-shot presets: the pre-training epochs)")
    sub.add_argument("--batch-size", type=positive_int, default=None, help="default: the recipe's")
    sub.add_argument("--limit", type=positive_int, default=None,
                     help="read only the first N training images (before a class split)")
    sub.add_argument("--seed", type=seed_value, default=None,
                     help="default: the recipe's (initialization and data order)")
    sub.add_argument("--episodes", type=positive_int, default=None,
                     help="few-shot presets: meta-training episodes (default: the recipe's)")
    sub.add_argument("--pretrained", default=None,
                     help="few-shot presets: start from the pre-trained backbone of another run of the same recipe "
                          "(its output directory) instead of pre-training")
    sub.add_argument("--out", default=None, type=output_directory,
                     help="output directory (default otzoo_runs/PRESET)")
    sub.add_argument("--strategy", choices=["auto", "one_device", "mirrored", "multi_worker"], default="auto",
                     help="tf.distribute strategy (default auto: all local GPUs, else the CPU; TF_CONFIG's workers); "
                          "on jax: auto (all local devices) or one_device; on torch: one device")
    sub.add_argument("--workers", type=positive_int, default=1,
                     help="start N local worker processes on 127.0.0.1 (multi-worker training: --strategy auto "
                          "or multi_worker; a run begun with --workers resumes with --workers, one begun without "
                          "resumes without)")
    sub.add_argument("--resume", action="store_true",
                     help="continue the unfinished run in --out from its training state; with none there, say so "
                          "(one line on stderr) and train from scratch, so the same command also restarts a run")
    sub.add_argument("--tensorboard", type=output_directory, default=None,
                     help="write TensorBoard logs into this directory")
    sub.add_argument("--config", default=None,
                     help="a best.json from `otzoo tune` (the head's parameters and the learning rate)")
    sub.add_argument("--dataset", choices=sorted(DATASETS), default=None,
                     help="train the preset's architecture and recipe on this data set (default: the preset's)")
    sub.add_argument("--image-size", type=positive_int, default=None,
                     help="TFDS data sets: the images' side (default: 32 for CIFAR, 224 otherwise)")
    sub.add_argument("--data-dir", default=None, help="TFDS data sets: the folder holding them (default: TFDS's)")
    sub.add_argument("--recipe", action="append", default=None, metavar="FIELD=VALUE", type=recipe_item,
                     help="override a recipe field (VALUE in JSON; repeatable), e.g. --recipe optimizer=adam")
    sub.set_defaults(run=train)

    sub = commands.add_parser("evaluate", help="recompute a preset's card metrics on the test split",
                              description=evaluate.__doc__)
    sub.add_argument("preset", metavar="PRESET", type=preset_or_directory,
                     help="a preset name or a preset directory (a copy, a fine-tuned run)")
    sub.add_argument("--weights", type=weights_location, default=None,
                     help="a weights file or directory instead of the packaged one (compared with the card of its "
                          "preset directory, not the packaged card)")
    sub.add_argument("--limit", type=positive_int, default=None,
                     help="evaluate on the first N test images (retrieval and few-shot: those of the evaluated "
                          "classes among them)")
    sub.add_argument("--episodes", type=positive_int, default=None,
                     help="few-shot presets: evaluation episodes per setting (default: the recipe's)")
    sub.add_argument("--data-dir", default=None, help="TFDS data sets: the folder holding them (default: TFDS's)")
    sub.set_defaults(run=evaluate)

    sub = commands.add_parser("fine-tune", help="fit a pretrained preset on a data slice and save it",
                              description=fine_tune.__doc__)
    sub.add_argument("preset", metavar="PRESET", type=preset_or_directory,
                     help="a preset name or a preset directory (a training run, a fine-tuned run)")
    sub.add_argument("--out", required=True, type=new_preset_directory,
                     help="the preset directory to write (a new one: an existing preset is not replaced)")
    sub.add_argument("--epochs", type=positive_int, default=1)
    sub.add_argument("--limit", type=positive_int, default=4096,
                     help=f"fit on the first N training images (in full batches of {FINE_TUNE_BATCH}: an incomplete "
                          "last batch is dropped; retrieval: the seen classes' among them; few-shot: episodes of the "
                          "base classes')")
    sub.add_argument("--learning-rate", type=positive_number, default=0.01, help="SGD (momentum 0.9) step size")
    sub.add_argument("--seed", type=seed_value, default=0)
    sub.set_defaults(run=fine_tune)

    sub = commands.add_parser("demo", help="load, evaluate, fine-tune and export the MPW preset",
                              description=demo.__doc__)
    sub.add_argument("--limit", type=positive_int, default=4096, help="fine-tune on the first N training images")
    sub.add_argument("--test-limit", type=positive_int, default=10000, help="evaluate on the first N test images")
    sub.add_argument("--learning-rate", type=positive_number, default=0.01)
    sub.add_argument("--seed", type=seed_value, default=0)
    sub.add_argument("--out", default="otzoo_demo", type=output_directory,
                     help="where the SavedModel (on JAX and PyTorch: the fine-tuned preset, OUT/fine_tuned, which "
                          "must not hold one already) is written")
    sub.set_defaults(run=demo, preset=DEMO_PRESET)  # the preset it loads (read by _packaged_weights_noted)

    for command in (explain_command, export_command, tune_command):
        command.register(commands, ArgumentParser)

    args, extra = parser.parse_known_args(argv)
    if extra:  # argparse leaves explain's image files unparsed when they follow an option
        if getattr(args, "command", None) != "explain" or any(item.startswith("-") for item in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.images = list(args.images) + extra
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `otzoo train --workers` passes to its workers
    try:
        check_backend(args)
        with _packaged_weights_noted(args):
            status = args.run(args)
    except (EmptySliceError, ResumeMismatchError) as error:  # the argument named as its option (--limit, --out)
        print(f"otzoo {args.command}: error: {error.option_message()}", file=sys.stderr)
        return 2
    except USER_ERRORS as error:
        print(f"otzoo {args.command}: error: {error}", file=sys.stderr)
        return 2
    except ClusterStartError as error:  # the machine's condition (a port in use), not the command's: exit 1
        print(f"otzoo {args.command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: the user's stop, not a fault (130: 128 + SIGINT, as shells report it)
        resume = "; the same command with --resume continues from the last backup" \
            if args.command in ("train", "tune") else ""
        print(f"otzoo {args.command}: interrupted{resume}", file=sys.stderr)
        return 130
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
