"""ONNX export through tf2onnx, with the SavedModel's input and output names and a dynamic batch axis.

The graph is the default signature of :mod:`export.signatures` (float32 pixels; onnxruntime clients cast uint8
pixels to float32, which is exact for 0-255). Axis 0 of every input and output is a symbolic dimension: ``batch``
for the batched inputs and all outputs, ``support`` for a few-shot model's support set.
"""
import numbers
import os
import tempfile
import warnings

from export.permissions import publishable
from export.signatures import serving_spec
from ot_layers.optional import require, tensorflow_if_installed
from ot_layers.validation import check_output_path

tf = tensorflow_if_installed("ONNX export")


def _check_opset(opset):
    if opset is None:
        return None
    if isinstance(opset, bool) or not isinstance(opset, numbers.Integral) or opset < 13:
        raise ValueError(f"`opset` must be an ONNX opset >= 13 or None (tf2onnx's default), got {opset!r}.")
    return int(opset)


def _name_dynamic_axes(model_proto, spec):
    """Give axis 0 of every graph input and output a named symbolic size (tf2onnx leaves ``unk__N``)."""
    for value in model_proto.graph.input:
        axis = "batch" if value.name in spec.batched_inputs else "support"
        value.type.tensor_type.shape.dim[0].dim_param = axis
    for value in model_proto.graph.output:
        value.type.tensor_type.shape.dim[0].dim_param = "batch"


def to_onnx(model, path, opset=None, task=None):
    """Write ``model`` as an ONNX file at ``path`` (parent directories created) and return ``path``.

    ``opset``: the ONNX opset (``None``: tf2onnx's default). ``task``: see :mod:`export.signatures`. The file is
    written beside ``path`` first and moved into place when complete: a file already at ``path`` is replaced (at
    once, never left half-written; a failed export leaves it as it was). The file gets the mode the process's umask
    gives a new file (0644 under umask 022). Raises ``ValueError`` naming the exportable alternative for a model
    with an unexportable layer, before writing anything.
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
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=".tmp-export-", suffix=".onnx", dir=folder)
    os.close(handle)
    try:
        onnx.save(model_proto, temp)
        publishable(temp)  # mkstemp's 0600 -> 0666 less the umask
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.remove(temp)
        raise
    return path
