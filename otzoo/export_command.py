"""``otzoo export NAME_OR_PATH --format saved_model|onnx|both --out DIR [--version N] [--no-verify]``.

Exports a preset (by name, with its packaged weights), a ``.keras`` file or a preset directory (``zoo.save_preset``,
``otzoo fine-tune``, a copy of a built-in preset; its weights are checked against its card's sha256 before they
load): the SavedModel goes to ``DIR/<name>/<version>/`` (with ``DIR/<name>/models.config``), the ONNX file to
``DIR/<name>.onnx``. The served task is ``--task``, else the card's ``task`` (a preset name or directory), else the
one a ``.keras`` model states (``ot_layers.TaskModel``); a model stating none is exported as ``generic``. Unless
``--no-verify``, both are checked against Keras on real test images of the preset's data set (Fashion-MNIST for
a ``.keras`` file) given as raw uint8 pixels (``--images``, default 64), at batch sizes 1 and 64 (at most the
image count), in a process that cannot import otzoo; a difference above ``--atol`` (or a NaN output, or an
artifact that fails to run) is an error, as is a model whose ONNX conversion is invalid or that onnxruntime cannot
load. The artifacts are written to hidden temporary names first (a hidden directory inside ``DIR/<name>``, which
TF Serving does not load, and a hidden file beside ``DIR/<name>.onnx``) and put in place only once every one asked
for is written and has passed the check: a failed export removes them and leaves ``DIR`` as it was (no new version,
``models.config`` and an earlier ONNX file untouched). The name is that of the preset, the ``.keras`` file (less
``.keras``) or the preset directory (of its absolute path: ``otzoo export .`` takes the current directory's name); a
name that begins with no letter or digit is refused. Prints the signatures, their shapes, the sizes on disk and the
parity table.
"""
import os
import re
import shutil
import tempfile
import zipfile

import keras

import export
import zoo
from export.onnx import first_line
from export.saved_model import (directory_size, missing_directories, next_version, remove_if_empty,
                                write_model_config)
from export.signatures import TASKS, UINT8_SIGNATURE, serving_spec
from export.warmup import WARMUP_DIR, WARMUP_FILE
from ot_layers.optional import check_installed
from ot_layers.task_model import model_task
from ot_layers.validation import output_path_problem
from otzoo.arguments import (CommandError, ambiguous_preset, output_directory, positive_int, positive_number,
                             serving_version)
from otzoo.samples import sample_inputs
from training.recipes.common import card_spec
from zoo.preset_format import CARD_FILE, read_card
from zoo.registry import PRESETS

FORMATS = ("saved_model", "onnx", "both")
BATCH_SIZES = (1, 64)


def register(commands, parser_class):
    """Add the ``export`` sub-command (called by ``otzoo.cli.main``)."""

    sub = commands.add_parser("export", help="export a preset or .keras model for TF Serving and ONNX, verified",
                              description=__doc__.split("\n\n")[1])
    sub.add_argument("model", metavar="NAME_OR_PATH", help="a preset name, a .keras file or a preset directory")
    sub.add_argument("--format", choices=FORMATS, default="both", help="default: both")
    sub.add_argument("--out", required=True, type=output_directory, help="output directory")
    sub.add_argument("--version", type=serving_version, default=None,
                     help="the SavedModel version (default: one above the highest there)")
    sub.add_argument("--task", choices=TASKS, default=None,
                     help="default: the preset card's task, or the one the model states (else generic)")
    sub.add_argument("--no-verify", action="store_true", help="skip the parity check")
    sub.add_argument("--images", type=positive_int, default=64, help="test images in the parity check (default 64)")
    sub.add_argument("--atol", type=positive_number, default=1e-5, help="largest accepted max abs difference (1e-5)")
    sub.set_defaults(run=run)


# What keras.saving.load_model raises for a damaged or foreign .keras file: a config that is no JSON (ValueError) or
# names a class Keras does not know (ValueError) or rejects its arguments (TypeError; Keras turns a TypeError of
# from_config into one), weights that do not fit (ValueError), an archive entry missing (zipfile's KeyError "There
# is no item named ... in the archive"), a damaged archive (zipfile.BadZipFile) or weights file (h5py's OSError).
# Anything else (an AttributeError in a layer's code, a MemoryError) is a bug or a fault, and keeps its traceback,
# also where Keras wraps it in a TypeError (_raised_by_layer_code).
_UNREADABLE_FILE = (ValueError, TypeError, KeyError, zipfile.BadZipFile, OSError)


def _chain(error):
    """``error`` and the errors it was raised from or while handling (``__cause__``, ``__context__``), outermost
    first."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)


def _raised_by_layer_code(error):
    """Whether a ``TypeError`` of ``keras.saving.load_model`` wraps an error a layer's own code raised: Keras turns
    any error of a layer's ``__init__`` (when it builds the layer from its config) and any ``TypeError`` of a
    ``from_config`` into a ``TypeError`` of its own. An error raised in Keras' code (an argument the constructor does
    not take, ``Unrecognized keyword arguments``, an unknown class) is the file's; so is a ``ValueError`` anywhere
    (a value the layer's checks refuse); any other error raised outside Keras (a ``TypeError`` in a ``from_config``,
    an ``AttributeError`` in an ``__init__``) is a bug, whose traceback must not be lost."""
    for link in _chain(error):
        frame = link.__traceback__
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        module = frame.tb_frame.f_globals.get("__name__", "") if frame is not None else ""
        if not isinstance(link, ValueError) and module.partition(".")[0] != "keras":
            return True
    return False


def _model_name(target):
    """The served name of the model at path ``target``: the last part of its absolute path (``.`` and ``..``
    name the directories they stand for), less ``.keras`` for a file, with any character but letters, digits,
    ``_``, ``.`` and ``-`` replaced by ``_``; a :class:`CommandError` when it begins with no letter or digit (an
    empty name, ``..``, a hidden file), which would put the artifacts at a hidden or another path."""
    name = os.path.basename(os.path.abspath(target))
    if name.endswith(".keras") and os.path.isfile(target):
        name = name[:-len(".keras")]
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", name)
    if not re.match(r"[A-Za-z0-9]", name):
        raise CommandError(f"NAME_OR_PATH: {target!r} gives the model name {name!r}, which must begin with a letter "
                           "or digit (it names DIR/<name>/ and DIR/<name>.onnx); export a copy under another name.")
    return name


def _load(target):
    """``(model, name, task, preset spec or None)`` for a preset name, a ``.keras`` file or a preset directory; the
    task: the preset's card's (a name or a directory) or the one a ``.keras`` model states (``None``: generic); the
    spec of a directory: the one its card describes (its data set, input shape and class split)."""
    problem = ambiguous_preset(target)
    if problem:
        raise CommandError(f"NAME_OR_PATH: {problem}.")
    if target in PRESETS:
        return zoo.load(target), target, zoo.model_card(target)["task"], PRESETS[target]
    if target.endswith(".keras") and not os.path.isdir(target):  # a preset directory may end in .keras too
        if not os.path.isfile(target):
            raise CommandError(f"NAME_OR_PATH: no .keras file at {target!r}.")
        if not zipfile.is_zipfile(target):  # Keras would report such a file as not found
            raise CommandError(f"NAME_OR_PATH: {target!r} is not a .keras archive (a zip file); is it damaged or cut "
                               "short?")
        name = _model_name(target)
        try:  # compile=False: export needs no optimizer, and one saved on another backend (e.g. PyTorch's) would
            # import that backend's code into this TensorFlow process
            model = keras.saving.load_model(target, compile=False)
        except _UNREADABLE_FILE as error:  # a file Keras cannot read: one line, not a traceback
            if isinstance(error, KeyError) and "in the archive" not in str(error):
                raise  # a KeyError of the loading code itself, not an entry missing from the archive
            if isinstance(error, TypeError) and _raised_by_layer_code(error):
                raise  # a bug in a layer's deserialization: its traceback, chained under Keras' TypeError
            cause = list(_chain(error))[-1] if isinstance(error, TypeError) else error  # not Keras' wrapping text
            raise CommandError(f"NAME_OR_PATH: cannot load {target!r}: {first_line(cause)}") from None
        return model, name, model_task(model), None
    if os.path.isdir(target):
        if not os.path.isfile(os.path.join(target, CARD_FILE)):
            raise CommandError(f"NAME_OR_PATH: the directory {target!r} holds no preset ({CARD_FILE} missing).")
        name = _model_name(target)  # before the model loads
        card = read_card(target) or {}
        model = zoo.load(target)  # checks the weights against the card's sha256 before loading
        spec = None  # a directory zoo.save_preset wrote for a model of one's own: checked like a .keras file
        if card.get("dataset") is not None and card.get("task") in {p.task for p in PRESETS.values()}:
            try:
                spec = card_spec(card)
            except ValueError as error:
                raise CommandError(f"NAME_OR_PATH: {target!r}: {error}") from None
        return model, name, card.get("task"), spec
    raise CommandError(f"NAME_OR_PATH: {target!r} is neither a preset ({', '.join(sorted(PRESETS))}) nor a .keras "
                       "file nor a preset directory.")


def _fits_without_task(model, task):
    """Whether ``--task`` (given) is what the model does not fit: the model serves under the task it states."""
    if not task:
        return False
    try:
        serving_spec(model)
    except ValueError:
        return False
    return True


def _size(path):

    total = directory_size(path) if os.path.isdir(path) else os.path.getsize(path)
    return f"{total / 1e6:.2f} MB"


def _check_extra(args):
    """Raise ``MissingExtraError`` (one line naming ``otzoo[export]``, exit status 2) before writing anything when
    a package the export needs is not installed."""
    if args.format in ("saved_model", "both"):  # its warm-up requests
        check_installed("tensorflow_serving.apis.prediction_log_pb2", "export", "the TF Serving export")
    if args.format in ("onnx", "both"):
        for module in ("tf2onnx", "onnx") + (() if args.no_verify else ("onnxruntime",)):
            check_installed(module, "export", "the ONNX export")


def run(args):
    """Export, verify and print the summary (see the module docstring)."""

    if args.version is not None and args.format == "onnx":
        raise CommandError("--version applies to the SavedModel; --format onnx writes no version.")
    _check_extra(args)
    model, name, task, preset = _load(args.model)
    task = args.task or task  # --task overrides the card's
    try:  # a model that cannot be served (a layer with no exportable form, outputs the task does not fit)
        spec = serving_spec(model, task)
    except ValueError as error:
        raise CommandError(f"{'--task' if _fits_without_task(model, args.task) else 'NAME_OR_PATH'}: {error}") from None
    if args.version is not None and os.path.exists(os.path.join(args.out, name, str(args.version))):
        raise CommandError(f"--version: {args.version} already exists in {os.path.join(args.out, name)}; versions "
                           "are never replaced (give another, or leave --version out for one above the highest).")
    targets = ([(os.path.join(args.out, name), True)] if args.format in ("saved_model", "both") else []) \
        + ([(os.path.join(args.out, f"{name}.onnx"), False)] if args.format in ("onnx", "both") else [])
    for path, directory in targets:  # before the model is converted: the export would have nowhere to go
        problem = output_path_problem(path, directory)
        if problem:
            raise CommandError(f"--out: {problem}.")
    inputs = None
    if not args.no_verify:
        data = preset.data if preset else None
        dataset = data.dataset if data else "fashion_mnist"
        classes = data.eval_classes if data and spec.task == "few_shot" else None
        image_size = data.input_shape[0] if data and dataset != "fashion_mnist" else None
        try:  # the parity check feeds the data set's test images, which the model's inputs must take
            inputs = sample_inputs(spec, args.images, classes=classes, dataset=dataset, image_size=image_size)
        except ValueError as error:
            raise CommandError(f"NAME_OR_PATH: {error} (--no-verify exports without the check)") from None
    print(f"{name}: task {spec.task}")
    staging = _Staging(args.out, name, args.format)
    try:
        saved, onnx_path = staging.write(model, task, args.version, spec)
        if inputs is not None:
            _check_parity(model, inputs, spec, task, saved, onnx_path, dataset, args.atol)
        staging.publish()
    except CommandError as error:  # the artifacts failed: none of them is put in place
        raise CommandError(f"{error}{staging.discard()}") from None
    except BaseException:
        staging.discard()
        raise
    if inputs is None:
        print("parity: not checked (--no-verify)")
    return 0


def _check_parity(model, inputs, spec, task, saved, onnx_path, dataset, atol):
    """Verify the written artifacts against ``model`` and print the parity table; a :class:`CommandError` when an
    artifact fails to run without otzoo, gives NaN, or differs from Keras by more than ``atol``."""
    count = len(inputs[spec.batched_inputs[0]])
    sizes = tuple(sorted({min(b, count) for b in BATCH_SIZES}))
    try:
        report = export.verify(model, inputs, saved_model_dir=saved, onnx_path=onnx_path, task=task,
                               batch_sizes=sizes)
    except export.VerificationError as error:
        raise CommandError(f"verification: {str(error).splitlines()[0]}") from None
    print(f"parity, max |artifact - Keras| on {count} {dataset} test images (raw uint8), batch "
          f"sizes {', '.join(str(b) for b in sizes)}, each artifact run without otzoo:")
    print("  " + report.table().replace("\n", "\n  "))
    nan = {artifact: sorted(names) for artifact, names in report.nan_outputs.items() if names}
    if nan:
        artifact, names = next(iter(nan.items()))
        raise CommandError(f"--atol: {artifact} gives NaN in {', '.join(names)} (the model's or the artifact's "
                           "outputs); a NaN output is never within tolerance.")
    worst = max(report, key=report.get)
    if not report[worst] <= atol:
        raise CommandError(f"--atol: {worst} differs from Keras by {report[worst]:.3g} > {atol:g}.")
    print(f"parity holds: every output within --atol {atol:g}")


class _Staging:
    """The artifacts of one ``otzoo export`` under hidden temporary names until they are published: the SavedModel
    version in a hidden directory inside ``DIR/<name>`` (TF Serving loads integer-named directories only), the ONNX
    file as a hidden file beside ``DIR/<name>.onnx``. :meth:`publish` renames them into place (and writes
    ``models.config``); :meth:`discard` removes them and the directories this export created, still empty."""

    def __init__(self, out, name, format):
        self.name, self.format = name, format
        self.base = os.path.abspath(os.path.join(out, name))  # the SavedModel's base directory
        self.onnx_final = os.path.abspath(os.path.join(out, f"{name}.onnx"))
        self.created = missing_directories(self.base if format in ("saved_model", "both") else os.path.abspath(out))
        self.staged_base = self.staged_onnx = self.version = None
        self.onnx_existed = False

    def write(self, model, task, version, spec):
        """Write the artifacts asked for under their temporary names and print them (by the paths they get once
        published); returns ``(version directory or None, ONNX file or None)`` as written."""
        saved = onnx_path = None
        if self.format in ("saved_model", "both"):
            os.makedirs(self.base, exist_ok=True)
            self.version = version or next_version(self.base)
            self.staged_base = tempfile.mkdtemp(prefix=".tmp-export-", dir=self.base)
            saved = export.to_saved_model(model, self.staged_base, version=self.version, task=task, name=self.name)
            warmup = os.path.join(saved, WARMUP_DIR, WARMUP_FILE)
            print(f"SavedModel {os.path.join(self.base, str(self.version))} ({_size(saved)}); "
                  f"{os.path.join(self.base, 'models.config')}"
                  f"{'; warm-up requests in ' + WARMUP_DIR + '/' + WARMUP_FILE if os.path.isfile(warmup) else ''}")
            for signature in spec.signature_names:
                print(f"  {signature}: {spec.describe(uint8=signature == UINT8_SIGNATURE)}")
        if self.format in ("onnx", "both"):
            folder = os.path.dirname(self.onnx_final)
            os.makedirs(folder, exist_ok=True)
            self.onnx_existed = os.path.exists(self.onnx_final)  # before the conversion, which may fail
            handle, self.staged_onnx = tempfile.mkstemp(prefix=".tmp-export-", suffix=".onnx", dir=folder)
            os.close(handle)
            try:  # a model tf2onnx converts into one that is invalid or that onnxruntime cannot load
                onnx_path = export.to_onnx(model, self.staged_onnx, task=task)
            except export.OnnxConversionError as error:
                raise CommandError(f"NAME_OR_PATH: {first_line(error)}; --format saved_model exports it "
                                   "without ONNX.") from None
            replacing = ", replacing the earlier file" if self.onnx_existed else ""
            print(f"ONNX {self.onnx_final} ({_size(onnx_path)}{replacing}); axis 0 dynamic")
            print(f"  {spec.describe()}")
        return saved, onnx_path

    def publish(self):
        """Rename the written artifacts into place: the ONNX file onto ``DIR/<name>.onnx``, the version directory to
        ``DIR/<name>/<version>`` (never onto an existing one) after ``models.config``."""
        if self.staged_base is not None:
            final = os.path.join(self.base, str(self.version))
            if os.path.exists(final):
                raise CommandError(f"--version: {self.version} appeared in {self.base} during the export; not "
                                   "replaced.")
            write_model_config(self.base, self.name)  # before any rename: it names the model and base only
        if self.staged_onnx is not None:
            os.replace(self.staged_onnx, self.onnx_final)
            self.staged_onnx = None
        if self.staged_base is not None:
            os.rename(os.path.join(self.staged_base, str(self.version)), final)
            shutil.rmtree(self.staged_base, ignore_errors=True)
            self.staged_base = None

    def discard(self):
        """Remove what was not published and the directories this export created (where still empty); returns the
        sentence that says so, for the error line."""
        removed = []
        if self.staged_base is not None:
            shutil.rmtree(self.staged_base, ignore_errors=True)
            removed.append(f"no version {self.version} in {self.base}")
        if self.staged_onnx is not None:
            if os.path.exists(self.staged_onnx):
                os.remove(self.staged_onnx)
            removed.append(f"the earlier {self.onnx_final} is kept" if self.onnx_existed
                           else f"no {self.onnx_final}")
        remove_if_empty(self.created)
        return f" Nothing is exported: {', '.join(removed)}." if removed else ""
