"""TF Serving warm-up requests: ``<version>/assets.extra/tf_serving_warmup_requests``.

TF Serving replays the records of this file (a TFRecord of ``tensorflow.serving.PredictionLog`` protos) when it
loads a version, so the first real request does not pay for graph initialization. One ``PredictRequest`` per
signature and batch size in :data:`BATCH_SIZES`, with deterministic pixel values (seed 0) in 0-255; a few-shot
request carries a support set of one image per class (labels ``0..ways-1``).
"""
import os

import numpy as np

from ot_layers.optional import require, tensorflow_if_installed

tf = tensorflow_if_installed("SavedModel warm-up records")

WARMUP_DIR = "assets.extra"
WARMUP_FILE = "tf_serving_warmup_requests"
BATCH_SIZES = (1, 8)
FEATURE = "writing TF Serving warm-up requests"


def serving_apis():
    """``tensorflow_serving.apis`` (the ``export`` extra's tensorflow-serving-api), with ``model_pb2``,
    ``predict_pb2`` and ``prediction_log_pb2`` loaded."""
    for name in ("model_pb2", "predict_pb2", "prediction_log_pb2"):
        require(f"tensorflow_serving.apis.{name}", "export", FEATURE)
    return require("tensorflow_serving.apis", "export", FEATURE)


def example_inputs(spec, batch_size, uint8=False, seed=0, support_size=None):
    """Deterministic inputs ``{name: array}`` for ``spec`` (a :class:`export.signatures.ServingSpec`) with
    ``batch_size`` rows in the batched inputs, or ``None`` when an input has an unknown non-batch size.

    Pixel inputs hold integers in 0-255 (uint8 when ``uint8``, else float32); the few-shot support set has
    ``support_size`` images (default: one per class) labelled ``0, 1, ..., ways-1, 0, ...``.
    """
    rng = np.random.default_rng(seed)
    ways = spec.output_shapes[0][-1] if spec.task == "few_shot" else None
    support_size = support_size or ways or 1
    named = {}
    for name, tensor_spec in zip(spec.input_names, spec.input_specs):
        rows = batch_size if name in spec.batched_inputs else support_size
        inner = tuple(tensor_spec.shape[1:])
        if any(d is None for d in inner):
            return None
        shape = (rows,) + inner
        if name == "support_labels":
            named[name] = (np.arange(rows) % (ways or 1)).astype(np.int32)
        elif name in spec.pixel_inputs:
            pixels = rng.integers(0, 256, size=shape, dtype=np.uint8)
            named[name] = pixels if uint8 else pixels.astype(np.float32)
        elif tensor_spec.dtype.is_floating:
            named[name] = rng.standard_normal(shape).astype(tensor_spec.dtype.as_numpy_dtype)
        else:
            named[name] = np.zeros(shape, tensor_spec.dtype.as_numpy_dtype)
    return named


def warmup_requests(spec):
    """``[(signature name, {input name: array})]``: the requests :func:`write_warmup_requests` writes (empty when
    an input has an unknown non-batch size)."""
    requests = []
    for signature in spec.signature_names:
        for batch_size in BATCH_SIZES:
            named = example_inputs(spec, batch_size, uint8=signature != spec.signature_names[0])
            if named is None:
                return []
            requests.append((signature, named))
    return requests


def write_warmup_requests(version_dir, spec, model_name):
    """Write the warm-up file into ``version_dir/assets.extra`` and return its path and record count; returns
    ``(None, 0)`` and writes nothing when the spec has inputs of unknown size (TF Serving then starts cold)."""
    apis = serving_apis()
    model_pb2, predict_pb2, prediction_log_pb2 = apis.model_pb2, apis.predict_pb2, apis.prediction_log_pb2
    requests = warmup_requests(spec)
    if not requests:
        return None, 0
    os.makedirs(os.path.join(version_dir, WARMUP_DIR), exist_ok=True)
    path = os.path.join(version_dir, WARMUP_DIR, WARMUP_FILE)
    with tf.io.TFRecordWriter(path) as writer:
        for signature, named in requests:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(name=model_name, signature_name=signature))
            for name, array in named.items():
                request.inputs[name].CopyFrom(tf.make_tensor_proto(array))
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path, len(requests)


def read_warmup_requests(path):
    """The requests of a warm-up file as ``[(model name, signature name, {input name: array})]``, parsed with
    ``prediction_log_pb2`` (what TF Serving reads)."""
    prediction_log_pb2 = serving_apis().prediction_log_pb2
    requests = []
    for record in tf.data.TFRecordDataset(path):
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        request = log.predict_log.request
        requests.append((request.model_spec.name, request.model_spec.signature_name,
                         {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}))
    return requests
