"""Parity of exported artifacts with Keras, each artifact run where otzoo cannot be imported.

:func:`verify` feeds the same inputs to the Keras model (in this process) and to each artifact in an isolated child
process (:mod:`export.isolation`): the SavedModel through ``tf.saved_model.load`` and its signatures -- after
checking that no node of its graph or of any function in its library is a Python op (``PyFunc``,
``PyFuncStateless``, ``EagerPyFunc``, ``NumpyFunction``), which TF Serving cannot run --, the ONNX file through
onnxruntime. It reports the maximum absolute difference per artifact, per output and per batch size, computed in
float64 (a bfloat16 output, which NumPy has no dtype for, is widened to float32 in the child, exactly; the exporters
serve half-precision outputs as float32 anyway, :mod:`export.signatures`).

A NaN anywhere in an output, from Keras or from the artifact (or both), fails the check: a served NaN is never
right, and a NaN compared as a number would vanish (``max(0.0, nan)`` is 0.0). That output's difference is
``inf`` (above any tolerance, however it is compared) and :attr:`ParityReport.nan_outputs` names it. Infinities
that agree (the same sign at the same place) differ by 0; any other infinity is an ``inf`` difference.

``top_k_classes`` is compared by what a swap costs: the largest gap between the Keras logits of the class Keras
ranks at a position and of the class the artifact ranks there (0 when the rankings agree; a swap of two classes
whose logits tie within the tolerance stays within it).
"""
import json
import math
import os
import tempfile

import numpy as np

from export.isolation import BLOCKED_PACKAGES, run_isolated
from export.saved_model import existing_versions
from export.signatures import DEFAULT_SIGNATURE, UINT8_SIGNATURE, serving_spec
from ot_layers.optional import check_installed

PYTHON_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc", "NumpyFunction")


class VerificationError(RuntimeError):
    """An artifact cannot be run the way a server runs it, or its outputs do not have Keras' names or shapes."""


_SAVED_MODEL_RUNNER = r'''
import json, os, sys
import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

artifact, manifest_path, feeds_path, outputs_path, result_path = sys.argv[1:6]
manifest = json.load(open(manifest_path))
python_ops = set(manifest["python_ops"])


def walk(graph_def, found, counts):
    for node in graph_def.node:
        counts[0] += 1
        if node.op in python_ops:
            found.add(f"{node.op} ({node.name})")
    for function in graph_def.library.function:
        counts[1] += 1
        for node in function.node_def:
            counts[0] += 1
            if node.op in python_ops:
                found.add(f"{node.op} ({function.signature.name}/{node.name})")


found, counts = set(), [0, 0]
proto = saved_model_pb2.SavedModel()
with open(os.path.join(artifact, "saved_model.pb"), "rb") as handle:
    proto.ParseFromString(handle.read())
for meta_graph in proto.meta_graphs:
    walk(meta_graph.graph_def, found, counts)
loaded = tf.saved_model.load(artifact)
for function in loaded.signatures.values():
    walk(function.graph.as_graph_def(), found, counts)
signatures = {}
for name, function in loaded.signatures.items():
    inputs = function.structured_input_signature[1]
    signatures[name] = {
        "inputs": {k: [v.dtype.name, [d for d in v.shape.as_list()]] for k, v in sorted(inputs.items())},
        "outputs": {k: [v.dtype.name, [d for d in v.shape.as_list()]]
                    for k, v in sorted(function.structured_outputs.items())}}
# An export of another task (or model) takes other inputs: the parent names `task` in one line, not a traceback.
fits = all(run["signature"] in signatures and sorted(signatures[run["signature"]]["inputs"]) == sorted(run["inputs"])
           for run in manifest["runs"])
result = {"python_ops": sorted(found), "nodes_checked": counts[0], "functions_checked": counts[1],
          "signatures": signatures, "modules": sorted(m for m in sys.modules if m.split(".")[0] in manifest["blocked"])}
outputs = {}
if not found and fits:
    feeds = np.load(feeds_path)
    for run in manifest["runs"]:
        function = loaded.signatures[run["signature"]]
        got = function(**{name: tf.constant(feeds[f"{run['id']}__{name}"]) for name in run["inputs"]})
        for name, value in got.items():
            if value.dtype == tf.bfloat16:  # no NumPy dtype: np.savez would write raw 2-byte records (|V2)
                value = tf.cast(value, tf.float32)  # exact
            outputs[f"{run['id']}__{name}"] = value.numpy()
np.savez(outputs_path, **outputs)
json.dump(result, open(result_path, "w"))
'''

_ONNX_RUNNER = r'''
import json, sys
import numpy as np
import onnxruntime

artifact, manifest_path, feeds_path, outputs_path, result_path = sys.argv[1:6]
manifest = json.load(open(manifest_path))
session = onnxruntime.InferenceSession(artifact, providers=["CPUExecutionProvider"])
names = [o.name for o in session.get_outputs()]
result = {"signatures": {"onnx": {
    "inputs": {i.name: [i.type, list(i.shape)] for i in session.get_inputs()},
    "outputs": {o.name: [o.type, list(o.shape)] for o in session.get_outputs()}}},
    "python_ops": [], "modules": sorted(m for m in sys.modules if m.split(".")[0] in manifest["blocked"])}
feeds = np.load(feeds_path)
outputs = {}
# An export of another task (or model) takes other inputs: the parent names `task` in one line, not a traceback.
fits = all(sorted(result["signatures"]["onnx"]["inputs"]) == sorted(run["inputs"]) for run in manifest["runs"])
for run in manifest["runs"] if fits else ():
    got = session.run(names, {name: feeds[f"{run['id']}__{name}"] for name in run["inputs"]})
    for name, value in zip(names, got):
        outputs[f"{run['id']}__{name}"] = value
np.savez(outputs_path, **outputs)
json.dump(result, open(result_path, "w"))
'''


class ParityReport(dict):
    """``{artifact: max |artifact - Keras| over every output and batch size}`` (floats), with the details:

    - ``per_batch_size``: ``{artifact: {batch size: {output: max abs difference}}}``;
    - ``per_output``: ``{artifact: {output: max abs difference over batch sizes}}``;
    - ``signatures``: ``{artifact: {signature: {"inputs"/"outputs": {name: [dtype, shape]}}}}`` as the child
      process saw them;
    - ``checked``: ``{artifact: {"nodes": n, "functions": n}}``, the graph nodes searched for Python ops;
    - ``nan_outputs``: ``{artifact: set of outputs}``, the outputs that held a NaN on either side at some batch
      size; their difference is ``inf``, so no tolerance accepts them.

    Artifacts: ``"saved_model"`` (signature ``serving_default``), ``"saved_model_uint8"`` (``serving_uint8``, run
    when the pixel inputs were given as uint8) and ``"onnx"``.
    """

    def __init__(self, per_batch_size, signatures, checked, nan_outputs=None):
        super().__init__({artifact: _worst(_worst(d.values()) for d in by_batch.values())
                          for artifact, by_batch in per_batch_size.items()})
        self.per_batch_size = per_batch_size
        self.signatures = signatures
        self.checked = checked
        nan_outputs = nan_outputs or {}
        self.nan_outputs = {artifact: set(nan_outputs.get(artifact, ())) for artifact in per_batch_size}

    @property
    def per_output(self):
        return {artifact: {name: _worst(d[name] for d in by_batch.values())
                           for name in next(iter(by_batch.values()))}
                for artifact, by_batch in self.per_batch_size.items()}

    def table(self):
        """The per-output maxima as a text table (one row per artifact); ``nan`` marks an output that held a NaN."""
        per_output = self.per_output
        names = list(next(iter(per_output.values()))) if per_output else []
        width = max([len(a) for a in per_output] + [8])
        lines = [f"{'artifact':<{width}}  " + "  ".join(f"{n:>13}" for n in names)]
        for artifact, diffs in per_output.items():
            nan = self.nan_outputs.get(artifact, ())
            lines.append(f"{artifact:<{width}}  " + "  ".join(f"{'nan':>13}" if n in nan else f"{diffs[n]:>13.2e}"
                                                              for n in names))
        return "\n".join(lines)


def _named_inputs(spec, inputs):
    """``{signature input name: array}`` from ``inputs``, each array checked against its signature input (numbers,
    the rank and the fixed sizes), so that a wrong array is named here, not by TensorFlow or a child process."""
    if isinstance(inputs, dict):
        missing = [n for n in spec.input_names if n not in inputs]
        unknown = [n for n in inputs if n not in spec.input_names]
        if missing or unknown:
            raise ValueError(f"`inputs` lacks {missing} and has unknown {unknown}; the signature's inputs are "
                             f"{list(spec.input_names)}.")
        named = {n: np.asarray(inputs[n]) for n in spec.input_names}
    else:
        arrays = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if len(arrays) != len(spec.input_names):
            raise ValueError(f"`inputs`: {len(arrays)} array(s) given, the model takes {len(spec.input_names)} "
                             f"({list(spec.input_names)}).")
        named = {n: np.asarray(a) for n, a in zip(spec.input_names, arrays)}
    for (name, array), tensor_spec in zip(named.items(), spec.input_specs):
        expected = tuple(tensor_spec.shape.as_list())
        if array.dtype.kind not in "biuf":
            raise ValueError(f"`inputs` {name!r} must hold numbers, got an array of dtype {array.dtype}.")
        if array.ndim != len(expected) or any(want is not None and want != got
                                              for want, got in zip(expected, array.shape)):
            raise ValueError(f"`inputs` {name!r} must have shape {expected} (None: any size), got {array.shape}.")
    return named


def _check_batch_sizes(batch_sizes):
    if batch_sizes is None:
        return (None,)
    sizes = tuple(batch_sizes) if isinstance(batch_sizes, (list, tuple)) else (batch_sizes,)
    if not sizes or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in sizes):
        raise ValueError(f"`batch_sizes` must be integers >= 1 (or None: all inputs in one batch), got "
                         f"{batch_sizes!r}.")
    return tuple(int(b) for b in sizes)


def _chunks(spec, named, batch_size):
    total = len(named[spec.batched_inputs[0]])
    if total == 0:
        raise ValueError("`inputs` must hold at least one example.")
    lengths = {name: len(named[name]) for name in spec.batched_inputs}
    if batch_size is not None and len(set(lengths.values())) > 1:  # e.g. a generic model's support set and queries
        described = ", ".join(f"{name}: {length}" for name, length in lengths.items())
        raise ValueError(f"`batch_sizes`: the inputs differ in length ({described}), so there is no common batch to "
                         "split them into; verify them in one batch (batch_sizes=None).")
    if batch_size is not None and batch_size > total:
        raise ValueError(f"`batch_sizes`: {batch_size} is more than the {total} example(s) of `inputs`, so no batch "
                         "of that size would run.")
    size = batch_size or total
    for start in range(0, total, size):
        yield {n: (a[start:start + size] if n in spec.batched_inputs else a) for n, a in named.items()}


def _feed(spec, chunk, uint8):
    """The arrays a signature receives: pixels as uint8 (``uint8``) or float32, the rest in the spec's dtype."""
    feed = {}
    for name, tensor_spec in zip(spec.input_names, spec.input_specs):
        if uint8 and name in spec.pixel_inputs:
            feed[name] = chunk[name]
        else:
            feed[name] = chunk[name].astype(tensor_spec.dtype.as_numpy_dtype)
    return feed


def _worst(values):
    """The largest of ``values``, NaN-proof: ``inf`` when any is NaN (Python's ``max`` keeps or drops a NaN by its
    place), 0.0 when there are none."""
    worst = 0.0
    for value in values:
        value = float(value)
        if math.isnan(value):
            return math.inf
        worst = max(worst, value)
    return worst


def _holds_nan(array):
    array = np.asarray(array)
    return array.dtype.kind in "fc" and bool(np.isnan(array).any())


def _max_abs(got, want):
    """max |got - want| in float64; ``inf`` when either holds a NaN; equal infinities differ by 0."""
    got, want = got.astype(np.float64), want.astype(np.float64)
    if _holds_nan(got) or _holds_nan(want):
        return math.inf
    with np.errstate(invalid="ignore"):
        gap = np.abs(got - want)
    gap[got == want] = 0.0  # inf - inf is NaN; the same infinity at the same place agrees
    return float(np.max(gap))


def _difference(name, got, expected, keras_logits):
    got, want = np.asarray(got), np.asarray(expected)
    if got.shape != want.shape:
        raise VerificationError(f"output {name!r} has shape {got.shape}, Keras gives {want.shape}.")
    if got.size == 0:
        return 0.0
    if name == "top_k_classes":
        if got.min() < 0 or got.max() >= keras_logits.shape[-1]:
            raise VerificationError(f"output {name!r} holds classes outside 0..{keras_logits.shape[-1] - 1}.")
        if _holds_nan(keras_logits):  # a ranking among NaN logits is no agreement
            return math.inf
        chosen = np.take_along_axis(keras_logits, got.astype(np.int64), axis=-1)
        ranked = np.take_along_axis(keras_logits, want.astype(np.int64), axis=-1)
        return _max_abs(chosen, ranked)
    return _max_abs(got, want)


def _nan_in(name, got, expected, keras_logits):
    """Whether comparing output ``name`` met a NaN (in either side, or in the Keras logits ranking classes)."""
    if name == "top_k_classes" and keras_logits is not None:
        return _holds_nan(keras_logits)
    return _holds_nan(got) or _holds_nan(expected)


def _run_artifact(kind, artifact, runs, feeds):
    """Run ``runs`` (``[{"id", "signature", "inputs"}]``) on ``artifact`` in an isolated child; returns the child's
    result dict and ``{run id: {output: array}}``."""
    runner = _SAVED_MODEL_RUNNER if kind == "saved_model" else _ONNX_RUNNER
    with tempfile.TemporaryDirectory(prefix="otzoo-verify-") as tmp:
        paths = [os.path.join(tmp, f) for f in ("manifest.json", "feeds.npz", "outputs.npz", "result.json")]
        with open(paths[0], "w") as handle:
            json.dump({"runs": runs, "python_ops": PYTHON_OPS, "blocked": BLOCKED_PACKAGES}, handle)
        np.savez(paths[1], **feeds)
        process = run_isolated(runner, [os.path.abspath(artifact)] + paths)
        if process.returncode != 0:
            raise VerificationError(f"running the {kind} artifact {artifact} in a process without otzoo failed:\n"
                                    f"{process.stderr[-3000:]}")
        with open(paths[3]) as handle:
            result = json.load(handle)
        outputs = {}
        with np.load(paths[2]) as data:
            for key in data.files:
                run_id, name = key.split("__", 1)
                outputs.setdefault(int(run_id), {})[name] = data[key]
    if result["modules"]:
        raise VerificationError(f"the {kind} child imported project modules {result['modules']}.")
    if result["python_ops"]:
        raise VerificationError(f"the SavedModel {artifact} holds Python ops, which TF Serving cannot run: "
                                f"{', '.join(result['python_ops'])}.")
    return result, outputs


def _check_served_names(spec, task, kind, artifact, signatures, signature):
    """Raise ``ValueError`` naming ``task`` when the artifact's ``signature`` (``None``: the ONNX graph) lacks or has
    other input or output names than ``spec``: an export made for another task (or of another model), which the
    child did not run (a traceback from TensorFlow or onnxruntime before)."""
    served = signatures.get(signature or "onnx")
    expected = (sorted(spec.input_names), sorted(spec.output_names))
    if served is not None and (sorted(served["inputs"]), sorted(served["outputs"])) == expected:
        return
    given = f"`task`={task!r}" if task is not None else f"`task`=None (the task `model` states, {spec.task!r})"
    if served is None:
        found = f"has no signature {signature!r} (only {sorted(signatures)})"
    else:
        found = f"takes {sorted(served['inputs'])} and gives {sorted(served['outputs'])}"
    raise ValueError(f"{given} serves {expected[0]} -> {expected[1]}, but the {kind} artifact {artifact} {found}: "
                     "verify with the `task` it was exported with.")


def _check_artifacts(saved_model_dir, onnx_path):
    """At least one artifact, each where it is said to be: a version directory holding ``saved_model.pb`` (not the
    base directory above it) and an ONNX file; else one ``ValueError`` naming the argument, before any run."""
    if saved_model_dir is None and onnx_path is None:
        raise ValueError("`saved_model_dir` and `onnx_path` are both None: give at least one artifact to verify.")
    if saved_model_dir is not None:
        if not isinstance(saved_model_dir, (str, os.PathLike)):
            raise ValueError(f"`saved_model_dir` must be a directory path, got {saved_model_dir!r}.")
        if not os.path.isfile(os.path.join(saved_model_dir, "saved_model.pb")):
            versions = existing_versions(saved_model_dir)
            hint = (f" (a base directory: pass its version directory, e.g. "
                    f"{os.path.join(os.fspath(saved_model_dir), str(versions[-1]))!r})" if versions else "")
            raise ValueError(f"`saved_model_dir` {os.fspath(saved_model_dir)!r} holds no saved_model.pb{hint}.")
    if onnx_path is not None:
        if not isinstance(onnx_path, (str, os.PathLike)) or not os.path.isfile(onnx_path):
            raise ValueError(f"`onnx_path` must be an existing ONNX file, got {onnx_path!r}.")


def verify(model, inputs, saved_model_dir=None, onnx_path=None, task=None, batch_sizes=None,
           reference="graph"):
    """Compare each given artifact with ``model`` on ``inputs``; returns a :class:`ParityReport`.

    ``inputs``: an array, a list of arrays in the model's input order, or ``{signature input name: array}``;
    pixel inputs given as uint8 also run the SavedModel's ``serving_uint8`` signature with those very bytes
    (``"saved_model_uint8"``). ``saved_model_dir``: a version directory from :func:`export.to_saved_model`;
    ``onnx_path``: a file from :func:`export.to_onnx`. ``task``: as given to the exporters (``None``: the task the
    model states). ``batch_sizes``: the batch sizes to run, e.g. ``(1, 64)``, each at most the number of examples (the
    batched inputs are split into batches of that size; Keras runs the same batches); ``None``: all inputs in one
    batch. ``reference``: how Keras
    runs: ``"graph"`` (the model's call traced by ``tf.function`` without XLA, as ``model.predict`` runs it: the graph a
    server runs, after the same Grappler rewrites) or ``"eager"`` (op by op; fused kernels round differently, a few
    float32 ulps of the logits).

    An output holding a NaN, on either side, differs by ``inf`` and is named in the report's ``nan_outputs``.

    Raises ``ValueError`` naming the argument, before anything runs, for inputs that do not fit the signature
    (another shape, dtype, count, or an unknown name in the dict), a batch size above the number of examples, no
    artifact, a ``saved_model_dir`` without ``saved_model.pb`` (e.g. the base directory above the version) or an
    ``onnx_path`` that is no file; ``ValueError`` naming ``task``, once the artifact's names are read (before its
    inputs run), when its inputs or outputs are not the names ``task`` serves (an export made for another task);
    :class:`VerificationError` when an artifact fails to run without otzoo, holds Python ops, or lacks a named
    output or its shape.
    """
    spec = serving_spec(model, task)
    named = _named_inputs(spec, inputs)
    sizes = _check_batch_sizes(batch_sizes)
    if reference not in ("graph", "eager"):
        raise ValueError(f"`reference` must be 'graph' or 'eager', got {reference!r}.")
    if onnx_path is not None:  # the isolated child imports it: the extra first, then where the file is
        check_installed("onnxruntime", "export", "verifying an ONNX file")
    _check_artifacts(saved_model_dir, onnx_path)
    uint8 = bool(spec.pixel_inputs) and all(named[n].dtype == np.uint8 for n in spec.pixel_inputs)
    plan = []  # (run id, batch size, chunk)
    for size in sizes:
        for chunk in _chunks(spec, named, size):
            plan.append((len(plan), size or len(named[spec.batched_inputs[0]]), chunk))
    call = spec.keras_call(model, eager=reference == "eager")
    references = {run_id: spec.reference(call, chunk) for run_id, _, chunk in plan}
    artifacts = []
    if saved_model_dir is not None:
        artifacts.append(("saved_model", "saved_model", saved_model_dir, DEFAULT_SIGNATURE, False))
        if uint8:
            artifacts.append(("saved_model_uint8", "saved_model", saved_model_dir, UINT8_SIGNATURE, True))
    if onnx_path is not None:
        artifacts.append(("onnx", "onnx", onnx_path, None, False))
    per_batch, signatures, checked, nan_outputs = {}, {}, {}, {}
    for kind in ("saved_model", "onnx"):
        jobs = [a for a in artifacts if a[1] == kind]
        if not jobs:
            continue
        runs, feeds, owners = [], {}, {}
        for label, _, _, signature, as_uint8 in jobs:
            for run_id, _, chunk in plan:
                key = len(runs)
                owners[key] = (label, run_id)
                runs.append({"id": key, "signature": signature, "inputs": list(spec.input_names)})
                for name, array in _feed(spec, chunk, as_uint8).items():
                    feeds[f"{key}__{name}"] = array
        result, outputs = _run_artifact(kind, jobs[0][2], runs, feeds)
        for _, _, artifact, signature, _ in jobs:
            _check_served_names(spec, task, kind, artifact, result["signatures"], signature)
        for label, *_ in jobs:
            signatures[label] = result["signatures"]
            checked[label] = {"nodes": result.get("nodes_checked", 0), "functions": result.get("functions_checked", 0)}
        for key, (label, run_id) in owners.items():
            got, expected = outputs.get(key, {}), references[run_id]
            missing = [n for n in spec.output_names if n not in got]
            if missing:
                raise VerificationError(f"{label}: outputs {missing} missing; it gives {sorted(got)} (export and "
                                        f"verify with the same `task`).")
            logits = expected.get("logits")
            size = plan[run_id][1]
            diffs = per_batch.setdefault(label, {}).setdefault(size, {n: 0.0 for n in spec.output_names})
            for name in spec.output_names:
                diffs[name] = _worst((diffs[name], _difference(name, got[name], expected[name], logits)))
                if _nan_in(name, got[name], expected[name], logits):
                    nan_outputs.setdefault(label, set()).add(name)
    return ParityReport(per_batch, signatures, checked, nan_outputs)
