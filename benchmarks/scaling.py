"""Training steps per second of one zoo model under four data-parallel set-ups on this machine.

Set-ups, each in fresh processes, all with the same global batch (``--batch``, default 64) and model
(``zoo.image_classifier("small_convnet", "mpw", 10, input_shape=(28, 28, 1))``, SGD, on Fashion-MNIST-shaped
random pixel values in 0-255, float32):

- ``mirrored_1``: ``MirroredStrategy`` on 1 logical CPU device, ``training.fit`` (= ``model.fit``);
- ``mirrored_2``: ``MirroredStrategy`` on 2 logical CPU devices (the process's CPU split in two);
- ``workers_1``: ``MultiWorkerMirroredStrategy`` with 1 worker (``TF_CONFIG``), ``training.fit``'s own loop;
- ``workers_2``: 2 local worker processes on 127.0.0.1 (``training.launch``), gRPC ring all-reduce.

Each run times ``--steps`` training steps after ``--warmup`` steps (tracing excluded) from the callbacks' batch-end
hooks; steps/s is the global rate (global batches per second; for workers, the chief's rate). Reports the median
over ``--rounds``. GPUs are hidden: this measures the CPU machine the tests run on.

Run: ``python benchmarks/scaling.py [--rounds 3]``; writes ``benchmarks/results/scaling.json``.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from report import positive_count, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUPS = ("mirrored_1", "mirrored_2", "workers_1", "workers_2")


def _worker(args):
    """One timed run inside this process (``--run SETUP``); prints a JSON line with the steps per second."""
    if args.run.startswith("workers"):
        from training.distributed.strategies import make_strategy

        strategy = make_strategy("multi_worker")  # before any other TensorFlow op
    import tensorflow as tf

    if args.run.startswith("mirrored"):
        devices = int(args.run[-1])
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
        from training.distributed.strategies import make_strategy

        strategy = make_strategy("mirrored", [f"/cpu:{i}" for i in range(devices)])
    import keras
    import numpy as np

    import zoo
    from training.distributed.fit import describe_batches, fit
    from training.distributed.strategies import is_chief

    class StepClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter())

    def build():
        keras.utils.set_random_seed(0)
        model = zoo.image_classifier("small_convnet", "mpw", 10, input_shape=(28, 28, 1))
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    steps = args.warmup + args.steps
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(steps * args.batch, 28, 28, 1)).astype(np.float32)
    labels = rng.integers(0, 10, size=steps * args.batch).astype(np.int32)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).batch(args.batch, drop_remainder=True).prefetch(2)
    clock = StepClock()
    fit(build, data, epochs=1, strategy=strategy, callbacks=[clock], verbose=0)
    timed = clock.times[args.warmup - 1:]
    rate = (len(timed) - 1) / (timed[-1] - timed[0])
    if is_chief():
        print(json.dumps(dict(setup=args.run, steps_per_s=rate, batches=describe_batches(strategy, args.batch))))


def _run_setup(setup, args):
    common = ["--run", setup, "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    if setup.startswith("mirrored"):
        result = subprocess.run([sys.executable, __file__, *common], env=env, cwd=ROOT, capture_output=True,
                                text=True, timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"{setup} failed:\n{result.stderr[-3000:]}")
        output = result.stdout
    else:
        from training.distributed.launch import launch_workers

        with tempfile.TemporaryDirectory() as logs:
            results = launch_workers([sys.executable, __file__, *common], int(setup[-1]), logs, timeout=900,
                                     cwd=ROOT)
            if any(r.returncode != 0 for r in results):
                raise RuntimeError(f"{setup} failed:\n{results[0].output()[-3000:]}")
            output = results[0].output()
    line = [x for x in output.splitlines() if x.startswith("{")][-1]
    return json.loads(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=positive_count, default=3)
    parser.add_argument("--batch", type=positive_count, default=64, help="global batch")
    parser.add_argument("--steps", type=positive_count, default=40, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--run", choices=SETUPS, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "scaling.json"))
    args = parser.parse_args()
    if args.run:
        _worker(args)
        return
    sys.path.insert(0, ROOT)
    rows = []
    for setup in SETUPS:
        rates, described = [], None
        for _ in range(args.rounds):
            result = _run_setup(setup, args)
            rates.append(result["steps_per_s"])
            described = result["batches"]
            print(f"{setup}: {result['steps_per_s']:.2f} steps/s ({described})", flush=True)
        rows.append(dict(setup=setup, steps_per_s=statistics.median(rates), rounds=rates, batches=described,
                         examples_per_s=statistics.median(rates) * args.batch))
    base = rows[0]["steps_per_s"]
    for row in rows:
        row["relative_to_mirrored_1"] = row["steps_per_s"] / base
    with open("/proc/loadavg") as handle:
        load = handle.read().split()[:3]
    report = dict(machine=f"{platform.machine()} x{os.cpu_count()}", load_average_at_end=load,
                  model="zoo.image_classifier('small_convnet', 'mpw', 10, input_shape=(28, 28, 1))",
                  global_batch=args.batch, timed_steps=args.steps, warmup_steps=args.warmup, rounds=args.rounds,
                  command=f"python benchmarks/scaling.py --rounds {args.rounds}", setups=rows)
    write_json(args.out, report)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
