"""Few-shot meta-training speed: ``training.recipes.few_shot.meta_train`` (Keras' own training step, on every backend)
beside the same episodic step written out in TensorFlow (a ``tf.function`` around a ``GradientTape``, XLA).

Workload: the DeepEMD few-shot preset's model (``resnet20_emd_fewshot_fashion_mnist``: ResNet-20, ``EMDHead`` by
Sinkhorn), 5-way 1-shot episodes with 15 queries per class from Fashion-MNIST's base classes (the first ``--limit``
training images), SGD with momentum, as the preset's recipe meta-trains (``meta_train``'s defaults: ``jit_compile``
XLA on TensorFlow and JAX, eager on PyTorch). Both methods train on the episode's query cross-entropy alone (the
model is built with the preset's L2 penalty, which ``meta_train`` leaves out as the recipe does, and the
hand-written step never adds). The hand-written step is the peer on TensorFlow: one step per episode, the episodes
``meta_train`` draws. Needs Fashion-MNIST; a run in which every backend was skipped writes nothing.

Timed: the steady cost of an episode, without compiling. Each method meta-trains a fresh model for ``--short`` and
for ``--long`` episodes (each call compiles once); the episode cost is the difference of the two times over the
difference of the counts. One untimed ``--short`` run per method first takes the process's one-off costs (without it
the first round's short run on JAX, paying the process's first trace, took longer than its long run). ``--rounds``
rounds; on TensorFlow the two methods alternate within each round, so that the load of other processes affects both
alike. Every backend runs in a process of its own (``KERAS_BACKEND``). Reported: each method's median and minimum
milliseconds per episode over the rounds, and on TensorFlow the ratio of ``meta_train``'s median to the hand-written
step's. A round in which a method's cost comes out <= 0 (its compile time or other processes varied by more than
the extra episodes take) measured the load, not the episodes: it is left out for every method of that backend, so
that the ratio compares the same rounds, and counted.

    python benchmarks/meta_training.py [--rounds 3] [--out benchmarks/results/meta_training.json]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from report import positive_count, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRESET = "resnet20_emd_fewshot_fashion_mnist"


def _hand_written(model, images, labels, episodes, optimizer, seed=0):
    """The episodic step written out in TensorFlow (XLA): each episode's query cross-entropy, one step."""
    import tensorflow as tf

    from training.data.episodes import EpisodeSampler

    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    sampler = EpisodeSampler(labels, 5, 1, 15, seed)

    @tf.function(jit_compile=True)
    def step(query, support, support_labels, query_labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(query_labels, model([query, support, support_labels], training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    for index in range(episodes):
        support, support_label, query, query_label = sampler.episode(index)
        float(step(tf.constant(images[query], tf.float32), tf.constant(images[support], tf.float32),
                   tf.constant(support_label, tf.int32), tf.constant(query_label, tf.int32)))


def worker(args):
    """One backend's measurements, printed as one JSON line."""
    import keras

    from training.data.fashion_mnist import fashion_mnist_split
    from training.recipes.few_shot import meta_train
    from zoo.loading import build

    images, labels = fashion_mnist_split("few_shot", "base", limit=args.limit, normalize=False, relabel=True)
    methods = {"otzoo_meta_train": lambda *run: meta_train(*run, verbose=0)}
    if keras.backend.backend() == "tensorflow":
        methods["tensorflow_hand_written_xla"] = _hand_written
    per_episode = {name: [] for name in methods}
    for method in methods.values():  # untimed: the process's one-off costs (JAX's first trace ~8 s) fall here
        method(build(PRESET, l2=5e-4), images, labels, args.short, keras.optimizers.SGD(0.005, momentum=0.9))
    for _ in range(args.rounds):
        for name, method in methods.items():
            seconds = []
            for episodes in (args.short, args.long):
                keras.utils.set_random_seed(0)
                model = build(PRESET, l2=5e-4)
                optimizer = keras.optimizers.SGD(0.005, momentum=0.9)
                start = time.perf_counter()
                method(model, images, labels, episodes, optimizer)
                seconds.append(time.perf_counter() - start)
            per_episode[name].append(1000.0 * (seconds[1] - seconds[0]) / (args.long - args.short))
    print(json.dumps({"backend": keras.backend.backend(), "ms_per_episode": per_episode}))


def _episode_costs(measured):
    """``{method: per-round ms}`` of one backend -> each method's rounds, rounds left out, median and minimum over
    the rounds kept (those in which every method's cost is > 0; see the module's docstring)."""
    kept = [index for index in range(len(next(iter(measured.values()))))
            if all(rounds[index] > 0 for rounds in measured.values())]
    costs = {}
    for name, rounds in measured.items():
        costs[name] = {"rounds_ms": [round(x, 1) for x in rounds], "rounds_left_out": len(rounds) - len(kept)}
        if kept:
            costs[name].update(median_ms=round(statistics.median(rounds[i] for i in kept), 1),
                               min_ms=round(min(rounds[i] for i in kept), 1))
    return costs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=positive_count, default=3)
    parser.add_argument("--short", type=positive_count, default=5)
    parser.add_argument("--long", type=positive_count, default=35)
    parser.add_argument("--limit", type=positive_count, default=4000)
    parser.add_argument("--backends", nargs="+", default=["tensorflow", "jax", "torch"])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "meta_training.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.long <= args.short:
        parser.error(f"argument --long: must exceed --short ({args.short}), got {args.long}: the episode cost is the "
                     "difference of the two runs' times over the difference of their counts")
    if args.worker:
        return worker(args)
    results, load_before = {}, os.getloadavg()  # other processes' load, which the timings carry (after: ours too)
    for backend in args.backends:
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        proc = subprocess.run([sys.executable, __file__, "--worker", "--rounds", str(args.rounds), "--short",
                               str(args.short), "--long", str(args.long), "--limit", str(args.limit)],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            results[backend] = {"skipped": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
            continue
        measured = json.loads(proc.stdout.strip().splitlines()[-1])["ms_per_episode"]
        results[backend] = _episode_costs(measured)
        if "tensorflow_hand_written_xla" in results[backend]:
            ours, peer = results[backend]["otzoo_meta_train"], results[backend]["tensorflow_hand_written_xla"]
            results[backend]["ratio_meta_train_to_hand_written"] = (
                round(ours["median_ms"] / peer["median_ms"], 3) if "median_ms" in peer else None)
        print(backend, json.dumps(results[backend]), flush=True)
    record = {"workload": f"{PRESET}: 5-way 1-shot, 15 queries per class, SGD momentum 0.9; steady ms per episode "
                          f"({args.long} minus {args.short} episodes)", "rounds": args.rounds,
              "machine": f"{platform.machine()} x{os.cpu_count()}", "load_average_before": load_before,
              "load_average_after": os.getloadavg(), "results": results}
    if all("skipped" in result for result in results.values()):
        raise SystemExit(f"every backend was skipped ({results}); {args.out} is left as it was")
    write_json(args.out, record, indent=1)


if __name__ == "__main__":
    main()
