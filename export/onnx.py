"""ONNX export through tf2onnx, with the SavedModel's input and output names and a dynamic batch axis.

The graph is the default signature of :mod:`export.signatures` (float32 pixels; onnxruntime clients cast uint8
pixels to float32, which is exact for 0-255). Axis 0 of every input and output is a symbolic dimension
(:func:`axis_names`): ``batch`` for the batched input and all outputs of a one-input model and for a few-shot model's
queries and logits, ``support`` for its support set (images and labels: one size); each input and output of a
generic model with several inputs has a size of its own, ``<name>_batch``, as nothing says they are tied.
"""
import numbers
import os
import tempfile
import warnings

from export.permissions import publishable
from export.saved_model import missing_directories, remove_if_empty
from export.signatures import serving_spec
from ot_layers.names import unique_names
from ot_layers.optional import require, tensorflow_if_installed
from ot_layers.validation import check_output_path

tf = tensorflow_if_installed("ONNX export")


def _check_opset(opset):
    if opset is None:
        return None
    if isinstance(opset, bool) or not isinstance(opset, numbers.Integral) or opset < 13:
        raise ValueError(f"`opset` must be an ONNX opset >= 13 or None (tf2onnx's default), got {opset!r}.")
    return int(opset)


def axis_names(spec):
    """``{input or output name: the symbolic name of its axis 0}`` for the ONNX graph of ``spec``.

    One name stands for one size: inputs that share a name must share a batch size in onnxruntime clients' eyes.
    A task model ties its sizes (the few-shot queries and logits, ``batch``; the support images and labels,
    ``support``), as does a model with one input (its input and outputs, ``batch``). A generic model with several
    inputs states no tie (inputs combined by a reduction, a support set and queries): each input and output gets a
    name of its own, ``<name>_batch`` (made unique)."""
    if spec.task == "generic" and len(spec.input_names) > 1:
        values = tuple(spec.input_names) + tuple(spec.output_names)
        return dict(zip(values, unique_names([f"{name}_batch" for name in values])))
    names = {name: "batch" if name in spec.batched_inputs else "support" for name in spec.input_names}
    names.update({name: "batch" for name in spec.output_names})
    return names


def _name_dynamic_axes(model_proto, spec):
    """Give axis 0 of every graph input and output its named symbolic size (tf2onnx leaves ``unk__N``)."""
    names = axis_names(spec)
    for value in list(model_proto.graph.input) + list(model_proto.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = names[value.name]


class OnnxConversionError(ValueError):
    """tf2onnx gave an ONNX model that is not valid or that onnxruntime cannot load (an op it could not convert, a
    dtype ONNX or onnxruntime lacks), raised by :func:`to_onnx` before anything is written."""


def _subgraphs(node):
    for attribute in node.attribute:
        yield from ([attribute.g] if attribute.HasField("g") else [])
        yield from attribute.graphs


def _unconverted_ops(onnx, graph):
    """The op types in ``graph`` (and its subgraphs: loop bodies, branches) that no ONNX opset defines: the
    TensorFlow ops tf2onnx left as they were because it could not convert them (it logs them and goes on)."""
    found = set()
    for node in graph.node:
        if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, ""):
            found.add(node.op_type)
        for subgraph in _subgraphs(node):
            found |= _unconverted_ops(onnx, subgraph)
    return found


def first_line(error):
    """The first non-blank line of ``error``'s message (its type's name when it has none): for one-line errors."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def _check_converted(onnx, model_proto):
    """Raise :class:`OnnxConversionError` unless ``model_proto`` is a valid ONNX model (``onnx.checker`` with
    ``full_check``: types and shapes inferred strictly) that onnxruntime, where it is installed, can load.

    tf2onnx only logs the TensorFlow ops it cannot convert and returns a model holding them, which no runtime can
    load; this catches them (named) and the other defects a client would meet at load time."""
    unconverted = _unconverted_ops(onnx, model_proto.graph)
    if unconverted:
        raise OnnxConversionError(
            f"`model` cannot be converted to ONNX: tf2onnx could not convert the TensorFlow op(s) "
            f"{', '.join(sorted(unconverted))}; export it as a SavedModel, or replace the layer that uses them.")
    try:
        onnx.checker.check_model(model_proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        raise OnnxConversionError(f"`model` converts to an invalid ONNX model: {first_line(error)}") from None
    try:
        import onnxruntime
        from onnxruntime.capi import onnxruntime_pybind11_state as states
    except ImportError:
        return  # optional here (verify needs it): the checker above is the check
    # What onnxruntime says of a model it will not load; its internal errors keep their traceback.
    refusals = (states.Fail, states.InvalidGraph, states.NotImplemented, states.InvalidArgument,
                states.InvalidProtobuf)
    try:
        onnxruntime.InferenceSession(model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    except refusals as error:
        raise OnnxConversionError(f"`model` converts to an ONNX model onnxruntime cannot load: "
                                  f"{first_line(error)}") from None


def to_onnx(model, path, opset=None, task=None):
    """Write ``model`` as an ONNX file at ``path`` (parent directories created) and return ``path``.

    ``opset``: the ONNX opset (``None``: tf2onnx's default). ``task``: see :mod:`export.signatures`. The converted
    model is checked before anything is written: ``onnx.checker`` (``full_check``) and, where onnxruntime is
    installed, an onnxruntime session on the CPU must accept it. The file is then written beside ``path`` and moved
    into place when complete: a file already at ``path`` is replaced (at once, never left half-written; a failed
    export leaves it as it was, and removes the directories it created for ``path`` where still empty). The file
    gets the mode the process's umask gives a new file (0644 under umask 022).

    Raises ``ValueError`` naming the exportable alternative for a model with an unexportable layer, and
    :class:`OnnxConversionError` (a ``ValueError``) for a model tf2onnx converts into one that is invalid or that
    onnxruntime cannot load (naming the TensorFlow ops it could not convert, e.g. ``PyFunc``), both before writing
    anything.
    """
    spec = serving_spec(model, task)
    opset = _check_opset(opset)
    path = check_output_path("path", path, directory=False)
    tf2onnx = require("tf2onnx", "export", "ONNX export")
    onnx = require("onnx", "export", "ONNX export")
    newest = max(tf2onnx.constants.OPSET_TO_IR_VERSION)
    if opset is not None and opset > newest:
        raise ValueError(f"`opset` {opset} is newer than tf2onnx {tf2onnx.__version__} converts to (at most {newest}).")
    from keras.src.export.tf2onnx_lib import patch_tf2onnx  # private Keras API (setup.cfg bounds keras)

    with warnings.catch_warnings():  # the patch probes the removed ``np.object``
        warnings.simplefilter("ignore", FutureWarning)
        patch_tf2onnx()  # tf2onnx 1.17 with NumPy 2 (the patch Keras' own ONNX export applies)
    signature = spec.signature_specs()
    function = tf.function(spec.serving_function(model), input_signature=signature)
    model_proto, _ = tf2onnx.convert.from_function(function, input_signature=signature, opset=opset)
    _name_dynamic_axes(model_proto, spec)
    _check_converted(onnx, model_proto)
    folder = os.path.dirname(os.path.abspath(path))
    created = missing_directories(folder)  # removed again, when still empty, if writing fails
    os.makedirs(folder, exist_ok=True)
    temp = None
    try:
        handle, temp = tempfile.mkstemp(prefix=".tmp-export-", suffix=".onnx", dir=folder)
        os.close(handle)
        onnx.save(model_proto, temp)
        publishable(temp)  # mkstemp's 0600 -> 0666 less the umask
        os.replace(temp, path)
    except BaseException:
        if temp is not None and os.path.exists(temp):
            os.remove(temp)
        remove_if_empty(created)
        raise
    return path
