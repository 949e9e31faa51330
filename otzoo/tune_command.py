"""``otzoo tune PRESET``: keras-tuner random search over the head's parameters and the learning rate
(``training.tuning.search``); registered by ``otzoo.cli``.

A preset whose trials cannot run (a few-shot preset, a data set other than Fashion-MNIST), and a ``--limit`` or
``--validation-fraction`` that leaves no validation part or not one batch to train on, are one-line errors naming
the options (exit status 2)."""
import argparse
import os
import re
import sys

from otzoo.arguments import (CommandError, default_output_directory, open_fraction, output_directory, positive_int,
                              preset_name, seed_value)
from training.data.errors import EmptySliceError
from training.recipes.run_directory import held_state
from training.tuning.search import MODEL_FILES, TUNING_DATASET, tunable_tasks, tune, tuning_objective
from zoo.backbones import BACKBONES
from zoo.registry import PRESETS


def run(args):
    """Search the head's parameters and the learning rate on a validation part of the training split (for a
    retrieval preset: held-out seen classes, scored by MAP@R); print the trials and write OUT/best.json (read by
    ``otzoo train --config`` through ``training.recipes.tuned_config.load_tuned_config``). Each trial trains by the
    preset's recipe on one device of the active backend (TensorFlow, JAX or PyTorch). An --out that holds an earlier
    search (tuner/, best.json) is refused unless --resume continues it or --overwrite replaces it (keras-tuner's own
    default resumes; a search of many trials is not thrown away by a command run twice), and so is an --out that
    holds a trained model (a finished `otzoo train` run, a saved preset: metadata.json, model.weights.h5). --resume
    with no search there says so in one line on stderr and starts one; --resume where --out holds an earlier
    best.json but not its trials (tuner/) is refused (the new search would replace that best.json). --overwrite
    removes the earlier search's tuner/ (whatever preset it searched) and best.json, and nothing else, when the new
    search begins."""

    spec = PRESETS[args.preset]
    if tuning_objective(spec.task) is None:
        raise CommandError(f"preset: {args.preset} is a {spec.task} preset; tuning runs the trials of "
                           f"{' and '.join(tunable_tasks())} presets only.")
    if spec.data.dataset != TUNING_DATASET:
        raise CommandError(f"preset: {args.preset} trains on {spec.data.dataset}; tuning reads Fashion-MNIST only.")
    out = args.out or default_output_directory(os.path.join("otzoo_tune", args.preset))
    model_files = held_state(out, MODEL_FILES)
    if model_files:  # a finished `otzoo train` run or a saved preset: the search would replace its run.json
        raise CommandError(f"--out {out} holds a trained model ({', '.join(model_files)}), not a search; choose "
                           "another --out.")
    earlier = held_state(out, ["tuner", "best.json"])
    if earlier and not (args.resume or args.overwrite):  # keras-tuner's own default (overwrite=False) resumes
        raise CommandError(f"--out {out} holds an earlier search ({', '.join(earlier)}); pass --resume to continue "
                           "it, or --overwrite to start a new search in its place.")
    if args.resume and earlier == ["best.json"]:  # a new search would replace best.json: the earlier result lost
        raise CommandError(f"--out {out} holds the best.json of an earlier search but not its trials (tuner/), so "
                           "--resume has nothing to continue; pass --overwrite to replace it, or choose another "
                           "--out.")
    if args.resume and not earlier:
        print(f"otzoo {args.command}: --resume: no search in {out} to resume; starting a new one", file=sys.stderr,
              flush=True)
    try:
        tune(args.preset, args.trials, out, epochs=args.epochs, limit=args.limit, batch_size=args.batch_size,
             backbone=args.backbone, validation_fraction=args.validation_fraction, seed=args.seed,
             resume=args.resume, overwrite=args.overwrite, verbose=1)
    except EmptySliceError as error:  # the data carved by --limit / --validation-fraction: named as the options
        raise CommandError(as_options(error.option_message())) from None
    return 0


# tune()'s arguments as ``otzoo tune`` spells them, in the messages of its errors
OPTIONS = {"validation_fraction": "--validation-fraction", "limit": "--limit", "batch_size": "--batch-size",
           "epochs": "--epochs", "trials": "--trials", "backbone": "--backbone", "seed": "--seed", "out_dir": "--out"}


def as_options(message):
    """``message`` with tune()'s arguments in backquotes (``validation_fraction``) named as the options the user
    typed (``--validation-fraction``)."""
    return re.sub(r"`(\w+)`", lambda match: OPTIONS.get(match.group(1), match.group(0)), message)


def _backbone(text):
    """``--backbone``: a ``zoo.BACKBONES`` name."""
    if text not in BACKBONES:
        raise argparse.ArgumentTypeError(f"unknown backbone {text!r}; known: {', '.join(BACKBONES)}")
    return text


def register(commands, parser_class):
    """Add ``tune`` to the ``otzoo`` sub-commands."""

    sub = commands.add_parser("tune", help="search a preset's head parameters and learning rate (keras-tuner)",
                              description=run.__doc__)
    sub.add_argument("preset", type=preset_name)
    sub.add_argument("--trials", type=positive_int, default=10, help="configurations to train (default 10)")
    sub.add_argument("--epochs", type=positive_int, default=1, help="epochs per trial (default 1)")
    sub.add_argument("--limit", type=positive_int, default=None,
                     help="use the first N training images (the validation part is carved from them)")
    sub.add_argument("--batch-size", type=positive_int, default=None, help="default: the recipe's")
    sub.add_argument("--backbone", type=_backbone, default=None,
                     help="replace the preset's backbone (e.g. small_convnet for a quick search)")
    sub.add_argument("--validation-fraction", type=open_fraction, default=0.2,
                     help="part of the training images (retrieval: of the seen classes, at least two) held out to "
                          "score trials (default 0.2)")
    sub.add_argument("--seed", type=seed_value, default=0)
    again = sub.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true",
                       help="continue the search in --out; give the options it began with again (only --trials "
                            "may change; other differences are refused, naming them). An --out holding best.json "
                            "but no tuner/ is refused: there is nothing to resume")
    again.add_argument("--overwrite", action="store_true",
                       help="start a new search in --out, replacing an earlier one there: its tuner/ and best.json "
                            "are removed (without --resume or --overwrite, an --out holding a search is refused)")
    sub.add_argument("--out", default=None, type=output_directory, help="output directory (default otzoo_tune/PRESET)")
    sub.set_defaults(run=run)
