"""What a served model looks like: its task, its named inputs and outputs, and the functions behind them.

Both exporters (SavedModel and ONNX) and the verification use one :class:`ServingSpec`, so the artifacts and the
Keras reference agree on names, dtypes and post-processing.

Tasks and their signatures (``TASKS``):

- ``"classification"``: ``images`` -> ``logits``, ``probabilities`` (softmax of the logits), ``top_k_classes``
  (int32) and ``top_k_scores`` (the logits of those classes), ``k = min(5, classes)``;
- ``"retrieval"``: ``images`` -> ``embeddings`` (the model's unit vectors);
- ``"few_shot"``: ``query_images``, ``support_images``, ``support_labels`` (int32) -> ``logits``;
- ``"generic"``: any other model: inputs named after its Keras inputs, outputs ``output_0``, ``output_1``, ...

Pixel inputs (``images``, ``query_images``, ``support_images``) are float32 in the default signature and uint8 in
a second one (:data:`UINT8_SIGNATURE`); both carry raw 0-255 values, as zoo models normalize pixels themselves.
Outputs the model computes in half precision (``mixed_float16``, ``mixed_bfloat16``) are served as float32 (an exact
widening), and a classifier's ``probabilities`` and ``top_k`` are computed from those float32 logits.

The model's inputs and outputs must each be one tensor or a flat list of tensors (a functional or Sequential
model); a model with dict or nested inputs or outputs is refused (:func:`serving_spec`), as is a subclassed model,
which has no symbolic inputs in Keras 3 (wrap either in a functional model first).

How the task is found when ``task=None``: the task the model states (:func:`infer_task`). The zoo's builders and
``zoo.load`` return an ``ot_layers.TaskModel``, whose config carries its task (``config.json``, ``.keras``); a
preset directory's card names it too (``otzoo export`` reads it). A model that states no task is exported as
``"generic"`` (its Keras input names, ``output_0``, ...): nothing is guessed from layer names or shapes (logits and
unit embeddings look alike), so a new head needs no edit here. Pass ``task=`` to serve such a model as
``"classification"``, ``"retrieval"`` or ``"few_shot"``; ``task=`` also overrides the stated task.
"""
import re
from dataclasses import dataclass

import keras
import numpy as np

from ot_layers.names import unique_names
from ot_layers.optional import tensorflow_if_installed
from ot_layers.task_model import TASKS, model_task
from ot_layers.tensor_ops import walk_layers

tf = tensorflow_if_installed("SavedModel export")

DEFAULT_SIGNATURE = "serving_default"
UINT8_SIGNATURE = "serving_uint8"
TOP_K = 5

# The input names of the few-shot signature (those zoo.few_shot_model gives).
FEW_SHOT_INPUTS = ("query_images", "support_images", "support_labels")

_OUTPUTS = {
    "classification": ("logits", "probabilities", "top_k_classes", "top_k_scores"),
    "retrieval": ("embeddings",),
    "few_shot": ("logits",),
}


def _half_to_float32(tensor):
    """``tensor`` as float32 when it is float16 or bfloat16 (exact), else as it is: served outputs are at least
    float32 (bfloat16 has no NumPy dtype, and a softmax in float16 misses float32 tolerances)."""
    if tensor.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tensor, tf.float32)
    return tensor


def _as_list(outputs):
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def refuse_unexportable(model):
    """Raise ``ValueError`` with the reason of the first layer whose ``export_blocker`` is set (the reason names
    the exportable alternative, docs/api.md)."""
    for layer in walk_layers(model):
        reason = getattr(layer, "export_blocker", None)
        if reason:
            raise ValueError(f"Layer {layer.name!r} cannot be exported: {reason}")


def _input_names(model):
    """The names of the model's input layers (``keras.Input(name=...)``), in input order."""
    names = []
    for tensor in model.inputs:
        history = getattr(tensor, "_keras_history", None)
        names.append(history.operation.name if history is not None else tensor.name)
    return tuple(names)


def infer_task(model):
    """The serving task ``model`` states (``ot_layers.task_model.model_task``), or ``"generic"`` when it states
    none (see the module docstring)."""
    return model_task(model) or "generic"


def _check_task_fits(model, task):
    single_matrix = len(model.inputs) == 1 and len(model.outputs) == 1 and len(model.outputs[0].shape) == 2
    if task in ("classification", "retrieval") and not single_matrix:
        raise ValueError(f"`task`={task!r} needs a model with one input and one (batch, dim) output; this one has "
                         f"{len(model.inputs)} input(s) and outputs of shapes "
                         f"{[tuple(o.shape) for o in model.outputs]}. Use task='generic'.")
    if task == "few_shot" and (len(model.inputs) != 3 or len(model.outputs) != 1
                               or len(model.outputs[0].shape) != 2):
        raise ValueError("`task`='few_shot' needs a model with three inputs [query_images, support_images, "
                         f"support_labels] and one (queries, ways) output; this one has {len(model.inputs)} "
                         f"input(s) and {len(model.outputs)} output(s).")


def _clean(name, fallback):
    name = re.sub(r"[^A-Za-z0-9_]", "_", str(name or "")).strip("_")
    return name if name and name[0].isalpha() else fallback


@dataclass(frozen=True)
class ServingSpec:
    """The served interface of one model.

    ``input_names``/``input_specs``: in the Keras model's input order (the default signature's dtypes: float32
    pixels, the model's own dtype otherwise); ``pixel_inputs``: the inputs also served as uint8;
    ``batched_inputs``: the inputs whose axis 0 is the served batch (the queries, for few-shot: the support set is
    one per request); ``output_names``; ``top_k`` for classification; ``model_dtypes``: the dtypes the Keras model
    takes, which the served inputs are cast to (empty: those of ``input_specs``; they differ for a model whose
    image input is uint8 or float16, served as float32 pixels all the same).
    """
    task: str
    input_names: tuple
    input_specs: tuple
    pixel_inputs: tuple
    batched_inputs: tuple
    output_names: tuple
    output_shapes: tuple
    top_k: int = 0
    model_dtypes: tuple = ()

    @property
    def keras_dtypes(self):
        """The dtype of each input the Keras model takes (:attr:`model_dtypes`, else the signature's)."""
        return self.model_dtypes or tuple(spec.dtype for spec in self.input_specs)

    def signature_specs(self, uint8=False):
        """The ``tf.TensorSpec`` of each input (named), with pixel inputs as uint8 when ``uint8``."""
        return [tf.TensorSpec(spec.shape, tf.uint8 if uint8 and name in self.pixel_inputs else spec.dtype, name=name)
                for name, spec in zip(self.input_names, self.input_specs)]

    @property
    def signature_names(self):
        """The signatures a SavedModel of this spec has."""
        return (DEFAULT_SIGNATURE, UINT8_SIGNATURE) if self.pixel_inputs else (DEFAULT_SIGNATURE,)

    def serving_function(self, model):
        """``f(*inputs) -> {output name: tensor}``, the graph both exporters trace: casts the inputs to the
        model's dtypes, calls the model in inference mode and adds the task's post-processing."""
        dtypes = self.keras_dtypes

        def serve(*inputs):
            cast = [tf.cast(x, dtype) for x, dtype in zip(inputs, dtypes)]
            outputs = [_half_to_float32(o) for o in _as_list(model(cast if len(cast) > 1 else cast[0],
                                                                   training=False))]
            if self.task == "generic":
                return {name: out for name, out in zip(self.output_names, outputs)}
            if self.task == "retrieval":
                return {"embeddings": outputs[0]}
            if self.task == "few_shot":
                return {"logits": outputs[0]}
            logits = outputs[0]
            top = tf.math.top_k(logits, k=self.top_k)
            return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1),
                    "top_k_classes": top.indices, "top_k_scores": top.values}

        return serve

    def as_model_inputs(self, named):
        """The Keras model's positional inputs from ``{input name: array}`` (cast to the model's dtypes)."""
        arrays = [np.asarray(named[name]).astype(dtype.as_numpy_dtype)
                  for name, dtype in zip(self.input_names, self.keras_dtypes)]
        return arrays if len(arrays) > 1 else arrays[0]

    def keras_call(self, model, eager=False):
        """``f(model inputs) -> model outputs``: the Keras model's inference call, traced once as a graph (a
        ``tf.function`` without XLA over the signature's input specs, as ``model.predict`` runs it) or, with
        ``eager``, run op by op."""
        if eager:
            return lambda inputs: model(inputs, training=False)
        specs = [tf.TensorSpec(s.shape, dtype) for s, dtype in zip(self.input_specs, self.keras_dtypes)]
        graph = tf.function(lambda *xs: model(list(xs) if len(xs) > 1 else xs[0], training=False),
                            input_signature=specs, jit_compile=False)
        return lambda inputs: graph(*(inputs if isinstance(inputs, list) else [inputs]))

    def reference(self, call, named):
        """The Keras outputs by name for ``{input name: array}``: ``call`` (from :meth:`keras_call`) on the model
        inputs (half-precision outputs widened to float32, as served), post-processed in NumPy (float64 softmax, a
        stable descending sort for top-k), independently of the exported graph."""
        outputs = [np.asarray(_half_to_float32(tf.convert_to_tensor(o))) for o in _as_list(call(
            self.as_model_inputs(named)))]
        if self.task != "classification":
            return dict(zip(self.output_names, outputs))
        logits = outputs[0]
        shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
        probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
        order = np.argsort(-logits, axis=-1, kind="stable")[:, :self.top_k]
        return {"logits": logits, "probabilities": probabilities, "top_k_classes": order.astype(np.int32),
                "top_k_scores": np.take_along_axis(logits, order, axis=-1)}

    def describe(self, uint8=False):
        """One line: ``name dtype shape, ... -> name shape, ...`` (``-1``: any size)."""
        def shape(s):
            return "[" + ", ".join("-1" if d is None else str(d) for d in s) + "]"
        ins = ", ".join(f"{s.name} {s.dtype.name} {shape(s.shape)}" for s in self.signature_specs(uint8))
        outs = ", ".join(f"{n} {shape(s)}" for n, s in zip(self.output_names, self.output_shapes))
        return f"{ins} -> {outs}"


def _structure(model, which):
    """``model.input`` or ``model.output`` as the model was built (a tensor, list, dict, ...), or ``None`` where
    Keras keeps none (a Sequential model is always flat)."""
    try:
        return getattr(model, which)
    except (AttributeError, ValueError):
        return None


def _check_flat_structure(model):
    """Refuse a model whose inputs or outputs are a dict or nested: the signatures are built positionally."""
    for which in ("input", "output"):
        structure = _structure(model, which)
        nested = isinstance(structure, dict) or (isinstance(structure, (list, tuple))
                                                 and any(keras.tree.is_nested(x) for x in structure))
        if nested:
            kind = "a dict" if isinstance(structure, dict) else "a nested structure"
            raise ValueError(f"`model` has {kind} of {which}s; export serves one tensor or a flat list of them: "
                             f"wrap it, e.g. keras.Model(inputs=[...], outputs=[...]) listing its {which} tensors in "
                             "the order the signature should have.")


def serving_spec(model, task=None):
    """The :class:`ServingSpec` of ``model`` for ``task`` (one of ``TASKS``; ``None``: the task the model states,
    :func:`infer_task`).

    Raises ``ValueError`` naming ``model`` when it is not a built functional or Sequential model or has dict or
    nested inputs or outputs, naming the layer and the exportable alternative when a layer has an
    ``export_blocker``, and naming ``task`` when the model does not fit it.
    """
    if task is not None and task not in TASKS:
        raise ValueError(f"`task` must be one of {list(TASKS)} or None, got {task!r}.")
    if not isinstance(model, keras.Model) or not getattr(model, "inputs", None) \
            or not getattr(model, "outputs", None):
        raise ValueError("`model` must be a built keras.Model with known inputs and outputs (a functional or "
                         "Sequential model; a subclassed model has none: wrap it, "
                         f"inputs = keras.Input(shape); keras.Model(inputs, model(inputs))), got {model!r}.")
    _check_flat_structure(model)
    refuse_unexportable(model)
    task = task or infer_task(model)
    _check_task_fits(model, task)
    dtypes = [tf.as_dtype(t.dtype) for t in model.inputs]
    if task == "few_shot":
        names, pixels, batched = FEW_SHOT_INPUTS, FEW_SHOT_INPUTS[:2], FEW_SHOT_INPUTS[:1]
        dtypes[2] = tf.int32
    elif task in ("classification", "retrieval"):
        names, pixels, batched = ("images",), ("images",), ("images",)
    else:
        names = unique_names([_clean(n, f"input_{i}") for i, n in enumerate(_input_names(model))])
        pixels, batched = (), names
    # pixels are served as float32 (and uint8 by the second signature) whatever dtype the model's input has
    served = [tf.float32 if name in pixels else dtype for name, dtype in zip(names, dtypes)]
    specs = tuple(tf.TensorSpec((None,) + tuple(t.shape[1:]), dtype, name=name)
                  for t, dtype, name in zip(model.inputs, served, names))
    scalars = [i for i, o in enumerate(model.outputs) if len(o.shape) == 0]
    if scalars:
        raise ValueError(f"`model`: output {scalars[0]} is a scalar (shape ()); a served output has one row per "
                         "example (axis 0, the batch): give it one, e.g. keras.ops.expand_dims(x, 0) for one value "
                         "per request.")
    shapes = [(None,) + tuple(o.shape[1:]) for o in model.outputs]
    if task == "generic":  # named apart from the inputs too (a request and its response share one namespace in ONNX)
        outputs = unique_names(list(names) + [f"output_{i}" for i in range(len(shapes))])[len(names):]
    else:
        outputs = _OUTPUTS[task]
    top_k = 0
    if task == "classification":
        classes = shapes[0][-1]
        if classes is None:
            raise ValueError("`model`: a classifier needs a known number of classes (its output's last axis).")
        top_k = min(TOP_K, int(classes))
        shapes = [shapes[0], shapes[0], (None, top_k), (None, top_k)]
    return ServingSpec(task=task, input_names=tuple(names), input_specs=specs, pixel_inputs=tuple(pixels),
                       batched_inputs=tuple(batched), output_names=tuple(outputs),
                       output_shapes=tuple(tuple(s) for s in shapes), top_k=top_k,
                       model_dtypes=tuple(dtypes) if served != dtypes else ())
