"""SavedModel export in TF Serving's layout: ``<base_dir>/<version>/`` and ``<base_dir>/models.config``.

TF Serving watches ``base_dir`` for integer-named version directories and loads the newest; a version directory
must appear complete. The export is written into a hidden temporary directory inside ``base_dir`` (a name TF
Serving ignores) and renamed to ``<version>`` only once complete; any failure removes the temporary directory (and
``base_dir`` and the parents the export created for it, where still empty), so an existing version is never
replaced and no half-written one or stray directory is left. Before the rename the version directory and
everything in it get the modes any new directory and file get under the process's umask (the temporary is created
0700), so a TF Serving process under another user can read it (:mod:`export.permissions`).
"""
import os
import re
import shutil
import tempfile
import warnings

import keras

from export.permissions import publishable
from export.signatures import DEFAULT_SIGNATURE, UINT8_SIGNATURE, serving_spec
from export.warmup import serving_apis, write_warmup_requests
from ot_layers.optional import MissingExtraError
from ot_layers.validation import check_flag, check_output_path, check_positive_int

MODEL_CONFIG_FILE = "models.config"
_TEMP_PREFIX = ".tmp-export-"


MAX_VERSION = 2 ** 63 - 1  # TF Serving's ModelSpec.version is an int64: a client cannot ask for a larger one


def _check_version(version):
    try:
        checked = check_positive_int("version", version)
    except ValueError:
        checked = None
    if checked is None or checked > MAX_VERSION:
        raise ValueError(f"`version` must be an integer in 1 .. {MAX_VERSION} (TF Serving's int64 versions) or None "
                         f"(one above the highest version there), got {version!r}.") from None
    return checked


def existing_versions(base_dir):
    """The integer version directories in ``base_dir``, sorted."""
    if not os.path.isdir(base_dir):
        return []
    return sorted(int(n) for n in os.listdir(base_dir)
                  if re.fullmatch(r"[0-9]+", n) and os.path.isdir(os.path.join(base_dir, n)))


def next_version(base_dir):
    """The version a new export into ``base_dir`` gets when none is given: one above the highest integer name there,
    a directory or not (a stray file ``2`` would block the rename that publishes version 2; 1 when there is none)."""
    names = os.listdir(base_dir) if os.path.isdir(base_dir) else []
    return max([int(n) for n in names if re.fullmatch(r"[0-9]+", n)] or [0]) + 1


def model_config_text(name, base_path):
    """A ``models.config`` with one entry (TF Serving's ``ModelServerConfig`` text format, for
    ``tensorflow_model_server --model_config_file=...``), escaped as protobuf's ``text_format`` writes it with
    ``as_utf8=False`` (ASCII; no tensorflow-serving-api needed: ``tests/test_optional_extras.py`` checks it
    against the proto)."""
    # Imported here: protobuf comes with TensorFlow, and ``otzoo`` imports this module on machines without either.
    from google.protobuf import text_encoding

    def quoted(value):
        return '"' + text_encoding.CEscape(value.encode("utf-8"), as_utf8=False) + '"'

    return ("model_config_list {\n  config {\n"
            f"    name: {quoted(name)}\n    base_path: {quoted(base_path)}\n"
            f"    model_platform: {quoted('tensorflow')}\n  }}\n}}\n")


def _model_name(name, base_dir):
    name = name if name is not None else os.path.basename(base_dir)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", name):
        raise ValueError(f"`name` (the served model's name, default the base directory's name) must be letters, "
                         f"digits, '_', '.' or '-', got {name!r}.")
    return name


def _warn_if_config_differs(path, text):
    """Warn before ``path`` (an earlier ``models.config``) is replaced by ``text`` when they differ: another model
    name, or an entry edited by hand. The same content is replaced without a word."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            earlier = handle.read()
    except FileNotFoundError:
        return
    if earlier != text:
        warnings.warn(f"replacing {path}, which differs from the entry this export writes (another model name, or "
                      "edited by hand); its earlier content is not kept.", stacklevel=3)


def write_model_config(base_dir, name):
    """Write ``<base_dir>/models.config`` (an existing ``base_dir``) with the entry that serves ``base_dir`` under
    ``name``: written beside it and renamed onto it when complete, replacing an earlier file (with a
    ``UserWarning`` when that one says something else), as :func:`to_saved_model` writes it. For a version
    published by a rename of its own (``otzoo export`` renames a verified version into ``base_dir``)."""
    base_dir = os.path.abspath(base_dir)
    name = _model_name(name, base_dir)
    text = model_config_text(name, base_dir)
    path = os.path.join(base_dir, MODEL_CONFIG_FILE)
    handle, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".config", dir=base_dir)
    try:
        with os.fdopen(handle, "w") as stream:
            stream.write(text)
        publishable(temp)  # mkstemp's 0600 -> the umask's modes, as the config to_saved_model writes
        _warn_if_config_differs(path, text)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise
    return path


def missing_directories(path):
    """The directories ``os.makedirs(path)`` would create, deepest first."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def remove_if_empty(directories):
    """Remove each of ``directories`` (deepest first) that is empty, stopping at the first that is not: a directory
    something else has written into since is kept with its parents."""
    for directory in directories:
        try:
            os.rmdir(directory)
        except OSError:  # not empty (another writer), or already gone
            if os.path.exists(directory):
                return


def _write_signatures(model, spec, directory):
    archive = keras.export.ExportArchive()
    archive.track(model)
    serve = spec.serving_function(model)
    archive.add_endpoint(DEFAULT_SIGNATURE, serve, input_signature=spec.signature_specs())
    if spec.pixel_inputs:
        archive.add_endpoint(UINT8_SIGNATURE, serve, input_signature=spec.signature_specs(uint8=True))
    archive.write_out(directory, verbose=False)


def to_saved_model(model, base_dir, version=None, task=None, warmup=None, name=None):
    """Export ``model`` for TF Serving into ``<base_dir>/<version>`` and return that path.

    ``version``: an integer >= 1 that must not exist yet, or ``None`` for one above the highest there (1 in an empty
    directory). ``task``: see :mod:`export.signatures` (``None``: the task the model states, ``model.task``).
    Signatures: ``serving_default`` (float32 pixels) and, for image models, ``serving_uint8`` (uint8 pixels), both
    with the task's named inputs and outputs. ``warmup``: also write TF Serving warm-up requests
    (``assets.extra/tf_serving_warmup_requests``, :mod:`export.warmup`); they need tensorflow-serving-api
    (``otzoo[export]``): ``True`` requires it, ``None`` (default) writes them where it is installed and otherwise
    warns and skips them (TF Serving then starts cold), ``False`` skips them. A model with an input of unknown size
    (images of any side) has no warm-up request to write: ``True`` is then refused, ``None`` warns. ``name``: the served model's name in
    ``models.config`` and the warm-up requests (default: ``base_dir``'s name). ``<base_dir>/models.config`` gets
    the entry that serves ``base_dir`` under ``name``, replacing one there (with a ``UserWarning`` when the earlier
    file says something else: another name, or an edit by hand). The version directory and its files get
    the modes the process's umask gives new ones (0755 / 0644 under umask 022). A failed export removes what it
    wrote, and the directories it created for ``base_dir`` (``base_dir`` and any missing parents) where they are
    still empty.

    Raises ``ValueError`` naming the exportable alternative for a model with an unexportable layer (e.g.
    ``EMDHead(method="exact")``), before writing anything.
    """
    spec = serving_spec(model, task)
    base_dir = os.path.abspath(check_output_path("base_dir", base_dir, directory=True))
    if warmup is not None:
        warmup = check_flag("warmup", warmup)
    explicit_warmup = warmup is True
    if warmup is None:
        try:
            serving_apis()
            warmup = True
        except MissingExtraError as error:
            warnings.warn(f"{error}; the SavedModel is written without them (TF Serving starts cold).",
                          stacklevel=2)
            warmup = False
    elif warmup:
        serving_apis()  # before writing anything
    unknown = ", ".join(f"{s.name} {s.shape.as_list()}" for s in spec.input_specs if None in s.shape.as_list()[1:])
    if warmup and unknown:  # an input of unknown size: no request can be made up for it (warmup_requests is empty)
        if explicit_warmup:
            raise ValueError(f"`warmup`: the model's inputs of unknown size ({unknown}) leave no warm-up request to "
                             "write; pass warmup=None or False (TF Serving then starts cold).")
        warnings.warn(f"no warm-up requests: the model's inputs of unknown size ({unknown}) leave none to write "
                      "(TF Serving starts cold).", stacklevel=2)
        warmup = False
    name = _model_name(name, base_dir)
    if version is not None:
        version = _check_version(version)
        if os.path.exists(os.path.join(base_dir, str(version))):
            raise ValueError(f"`version` {version} already exists in {base_dir}; versions are never replaced "
                             "(pass another version, or None for one above the highest).")
    created = missing_directories(base_dir)  # removed again, when still empty, if the export fails
    os.makedirs(base_dir, exist_ok=True)
    try:
        temp_dir = tempfile.mkdtemp(prefix=_TEMP_PREFIX, dir=base_dir)
    except BaseException:
        remove_if_empty(created)
        raise
    try:
        _write_signatures(model, spec, temp_dir)
        if warmup:
            write_warmup_requests(temp_dir, spec, name)
        if version is None:
            version = next_version(base_dir)
        final = os.path.join(base_dir, str(version))
        if os.path.exists(final):
            raise ValueError(f"`version` {version} appeared in {base_dir} during the export; not replaced.")
        publishable(temp_dir)  # mkdtemp gives 0700: readable by others as the umask allows, before it is published
        # The config names the model and base_dir only (the same for every version): it goes first, so the
        # rename that publishes the version is the last step.
        write_model_config(base_dir, name)
        os.rename(temp_dir, final)
    except BaseException:
        shutil.rmtree(temp_dir, ignore_errors=True)
        remove_if_empty(created)
        raise
    return final


def directory_size(path):
    """The total size in bytes of the files under ``path``."""
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(path) for f in files)

