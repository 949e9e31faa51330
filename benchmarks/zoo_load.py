"""How long loading a pretrained preset takes, against Keras' own loader of the same model, in fresh processes.

For every preset with packaged weights, each round starts a new Python process that imports TensorFlow and Keras,
then times (a) ``zoo.load(name)`` (build from the registry + sha256 check + ``load_weights``) and, in another new
process, (b) ``keras.saving.load_model`` of the same model saved as a ``.keras`` file (the peer). The import time is
measured separately and not included. Reports medians over rounds, their ratio, and the size of the packaged
weights. Target: ``zoo.load`` (which also checks the weights' sha256) takes at most ``TARGET_RATIO`` times as long
as ``keras.saving.load_model`` of the same model, measured in the same run.
Run: ``python benchmarks/zoo_load.py [--rounds 3]``; writes ``benchmarks/results/zoo_load.json``.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

from report import positive_count, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_RATIO = 1.5

_TIMER = """
import os, sys, time, json
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
start = time.perf_counter()
import keras, tensorflow
import zoo
imported = time.perf_counter()
if sys.argv[1] == "zoo":
    model = zoo.load(sys.argv[2])
else:
    model = keras.saving.load_model(sys.argv[2])
loaded = time.perf_counter()
print(json.dumps({"import_s": imported - start, "load_s": loaded - imported}))
"""


def _time(kind, target):
    result = subprocess.run([sys.executable, "-c", _TIMER, kind, target], capture_output=True, text=True,
                            cwd=ROOT, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=positive_count, default=3)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "zoo_load.json"),
                        help="the JSON file written (default: %(default)s)")
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    import zoo
    from zoo.loading import WEIGHTS_FILE, preset_dir

    names = [n for n in zoo.list_models() if os.path.isfile(os.path.join(preset_dir(n), WEIGHTS_FILE))]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            keras_path = os.path.join(tmp, f"{name}.keras")
            zoo.load(name).save(keras_path)
            zoo_times, keras_times = [], []
            for _ in range(args.rounds):
                zoo_times.append(_time("zoo", name)["load_s"])
                keras_times.append(_time("keras", keras_path)["load_s"])
            size = os.path.getsize(os.path.join(preset_dir(name), WEIGHTS_FILE))
            ratio = statistics.median(zoo_times) / statistics.median(keras_times)
            rows.append(dict(preset=name, zoo_load_s=statistics.median(zoo_times),
                             keras_load_model_s=statistics.median(keras_times), ratio=ratio,
                             weights_bytes=size, target_ratio=TARGET_RATIO, holds=ratio <= TARGET_RATIO))
    total = sum(r["weights_bytes"] for r in rows)
    print(f"{'preset':<32} {'zoo.load':>9} {'load_model':>11} {'ratio':>6} {'weights':>9}")
    for r in rows:
        print(f"{r['preset']:<32} {r['zoo_load_s']:>8.2f}s {r['keras_load_model_s']:>10.2f}s {r['ratio']:>6.2f} "
              f"{r['weights_bytes'] / 1e6:>7.2f}MB")
    print(f"packaged weights in total: {total / 1e6:.2f} MB")
    out = dict(machine=f"{platform.machine()} x{os.cpu_count()}", rounds=args.rounds, presets=rows,
               total_weights_bytes=total)
    write_json(args.out, out)


if __name__ == "__main__":
    main()
