"""Serving speed on the CPU: onnxruntime, the SavedModel and Keras, per preset with packaged weights, in one run.

For every preset with weights: export a SavedModel and an ONNX file (``export.to_saved_model``/``to_onnx``),
check their parity with Keras (``export.verify`` on 64 real Fashion-MNIST test images as raw uint8, batch sizes 1
and 64, each artifact in a process that cannot import otzoo; against Keras' graph call, as ``model.predict`` runs
it, and against the eager call), measure how much an image's Keras output depends on the rest of its batch (each
image alone vs within the 64), then time on the same real images:

- ``onnxruntime``: ``InferenceSession(...).run`` (CPUExecutionProvider, default threads);
- ``saved_model``: ``tf.saved_model.load(...).signatures["serving_default"]`` (float32 pixels);
- ``keras_predict``: ``model.predict(x, batch_size=len(x))`` (not for few-shot models: ``predict`` slices every
  input along one batch axis, and the support set has its own);
- ``keras_call``: ``model(x, training=False)`` (eager).

Latency: the median of ``--calls`` single-image calls (after ``--warmup`` untimed ones); throughput: 64 images per
the median time of ``--rounds`` batch-64 calls. Few-shot models are timed with 1 or 64 queries against a 1-shot
support set of their ways. Everything runs in this one process on the CPU; the machine's load average is recorded,
since another job on the machine slows every runtime.
Run: ``python benchmarks/serving.py [--calls 50 --rounds 10]``; writes ``benchmarks/results/serving.json``.
"""
import argparse
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
from report import positive_count, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNTIMES = ("onnxruntime", "saved_model", "keras_predict", "keras_call")
THROUGHPUT_BATCH = 64


def _timed(function, warmup, repeats):
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _runners(model, spec, version_dir, onnx_path):
    """``{runtime: f(named float32 inputs)}`` (``None`` where a runtime cannot take the inputs)."""
    import onnxruntime
    import tensorflow as tf

    session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    signature = tf.saved_model.load(version_dir).signatures["serving_default"]
    names = list(spec.output_names)

    def keras_inputs(named):
        return spec.as_model_inputs(named)

    return {
        "onnxruntime": lambda named: session.run(names, named),
        "saved_model": lambda named: signature(**{k: tf.constant(v) for k, v in named.items()}),
        "keras_predict": None if spec.task == "few_shot" else
        (lambda named: model.predict(keras_inputs(named), batch_size=len(next(iter(named.values()))), verbose=0)),
        "keras_call": lambda named: model(keras_inputs(named), training=False),
    }


def _float_inputs(spec, named, rows):
    out = {}
    for name, tensor_spec in zip(spec.input_names, spec.input_specs):
        array = named[name][:rows] if name in spec.batched_inputs else named[name]
        out[name] = array.astype(tensor_spec.dtype.as_numpy_dtype)
    return out


def _batch_dependence(model, spec, named):
    """Max |output of an image run alone - its output within the whole batch| over the images and outputs (Keras'
    graph call, as ``model.predict`` runs it): what a server that batches requests needs to be 0 up to rounding.
    Few-shot models: each query alone against the same support set."""
    call = spec.keras_call(model)
    whole = spec.reference(call, named)
    rows = len(named[spec.batched_inputs[0]])
    worst = 0.0
    for row in range(rows):
        alone = spec.reference(call, {name: array[row:row + 1] if name in spec.batched_inputs else array
                                      for name, array in named.items()})
        for output, value in alone.items():
            if output != "top_k_classes":
                worst = max(worst, float(np.max(np.abs(value - whole[output][row:row + 1]))))
    return worst


def benchmark_preset(name, calls, rounds, warmup, folder):
    import export
    import zoo
    from otzoo.samples import sample_inputs
    from export.saved_model import directory_size
    from zoo.registry import PRESETS

    model = zoo.load(name)
    spec = export.serving_spec(model)
    classes = PRESETS[name].data.eval_classes if spec.task == "few_shot" else None
    images = sample_inputs(spec, THROUGHPUT_BATCH, classes=classes)
    version_dir = export.to_saved_model(model, os.path.join(folder, name))
    onnx_path = export.to_onnx(model, os.path.join(folder, f"{name}.onnx"))
    report = export.verify(model, images, saved_model_dir=version_dir, onnx_path=onnx_path,
                           batch_sizes=(1, THROUGHPUT_BATCH))
    eager = export.verify(model, images, saved_model_dir=version_dir, onnx_path=onnx_path,
                          batch_sizes=(1, THROUGHPUT_BATCH), reference="eager")
    one, batch = _float_inputs(spec, images, 1), _float_inputs(spec, images, THROUGHPUT_BATCH)
    timings = {}
    for runtime, run in _runners(model, spec, version_dir, onnx_path).items():
        if run is None:
            timings[runtime] = None
            continue
        latency = _timed(lambda: run(one), warmup, calls)
        per_batch = _timed(lambda: run(batch), max(1, warmup // 5), rounds)
        timings[runtime] = dict(latency_ms_batch1=1e3 * latency, images_per_s_batch64=THROUGHPUT_BATCH / per_batch)
    return dict(preset=name, task=spec.task, parity_max_abs=dict(report), parity_per_output=report.per_output,
                parity_max_abs_vs_eager=dict(eager), batch_dependence_max_abs=_batch_dependence(model, spec, images),
                saved_model_mb=directory_size(version_dir) / 1e6,
                onnx_mb=os.path.getsize(onnx_path) / 1e6, timings=timings)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=positive_count, default=50, help="timed batch-1 calls per runtime")
    parser.add_argument("--rounds", type=positive_count, default=10, help="timed batch-64 calls per runtime")
    parser.add_argument("--warmup", type=int, default=5, help="untimed calls before timing")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "serving.json"),
                        help="the JSON file written (default: %(default)s)")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    import zoo
    from zoo.loading import WEIGHTS_FILE, preset_dir

    names = [n for n in zoo.list_models() if os.path.isfile(os.path.join(preset_dir(n), WEIGHTS_FILE))]
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        rows = [benchmark_preset(n, args.calls, args.rounds, args.warmup, folder) for n in names]
    load_after = os.getloadavg()[0]
    print(f"{'preset':<40} {'runtime':<14} {'batch-1 ms':>10} {'img/s @64':>10}")
    for row in rows:
        for runtime in RUNTIMES:
            t = row["timings"][runtime]
            cells = (f"{t['latency_ms_batch1']:>10.2f} {t['images_per_s_batch64']:>10.0f}" if t
                     else f"{'-':>10} {'-':>10}")
            print(f"{row['preset']:<40} {runtime:<14} {cells}")
    print(f"{'preset':<40} {'parity (max abs vs Keras)':<30}")
    for row in rows:
        print(f"{row['preset']:<40} " + ", ".join(f"{k} {v:.2e}" for k, v in row["parity_max_abs"].items())
              + " | vs eager: " + ", ".join(f"{k} {v:.2e}" for k, v in row["parity_max_abs_vs_eager"].items())
              + f" | batch dependence {row['batch_dependence_max_abs']:.2e}")
    import onnxruntime
    import tensorflow as tf

    out = dict(machine=f"{platform.machine()} x{os.cpu_count()}", device="CPU", tensorflow=tf.__version__,
               onnxruntime=onnxruntime.__version__, load_average_before=load_before, load_average_after=load_after,
               calls=args.calls, rounds=args.rounds, warmup=args.warmup, throughput_batch=THROUGHPUT_BATCH,
               presets=rows)
    write_json(args.out, out)


if __name__ == "__main__":
    main()
