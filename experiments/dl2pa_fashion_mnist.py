"""DL2PA on Fashion-MNIST with d < K: dynamic vs fixed label-to-prototype assignment vs plain softmax.

Methods: ``dynamic`` (Hungarian re-assignment each epoch, as in the paper), ``dynamic_steps`` (also every
``--batch-frequency`` batches), ``fixed`` (identity assignment throughout), ``softmax`` (Dense(K) + cross-entropy).

Same backbone (zoo.small_convnet + global average pooling + Dense(d)), same data subset, seed and budget for the
three heads; dynamic and fixed use the same prototypes (estimate_prototypes(10, d)). The prototype methods train
the zoo's DL2PA pair, ``zoo.image_classifier("small_convnet", "hyperspherical")`` and
``zoo.hyperspherical_training_model``; the softmax baseline puts ``Dense(K)`` on that classifier's ``embedding``
layer. ``zoo_inputs.RAW_PIXELS`` keeps the images unnormalized, as the published runs had them. Writes each
``d``'s runs to ``experiments/results/dl2pa_fashion_mnist_d{d}.json`` (``--out``: another file, for one ``d``),
rewritten after every run; ``experiments/dl2pa_seeds.py`` summarizes them over seeds. The recorded runs
(docs/results/hyperspherical.md), one process per ``d``:

    PYTHONPATH=. python experiments/dl2pa_fashion_mnist.py --dims 3 --seeds 0 1 2 3 4 --epochs 6 --train 12000 \
        --methods dynamic dynamic_steps fixed softmax
    (the same with --dims 8)
"""
import argparse
import json
import os
import time

import keras
import numpy as np

import zoo
from ot_layers.callbacks import PrototypeReassignment
from ot_layers.losses import HypersphericalPullLoss
from training.data.fashion_mnist import load_fashion_mnist
from zoo_inputs import small_convnet_options
from otzoo.arguments import positive_int

NUM_CLASSES = 10


def build(method, dim, width):
    """``(train_model, predictor)``: the DL2PA classifier (BatchNorm momentum 0.9 for the short budget) and its
    training model (inputs ``[images, labels]``), or for ``"softmax"`` one model with ``Dense(K)`` logits."""
    classifier = zoo.image_classifier("small_convnet", "hyperspherical", NUM_CLASSES, head_kwargs={"dim": dim},
                                      **small_convnet_options(width))
    if method == "softmax":
        logits = keras.layers.Dense(NUM_CLASSES, name="classifier")(classifier.get_layer("embedding").output)
        model = keras.Model(classifier.inputs[0], logits)
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model, model
    train_model = zoo.hyperspherical_training_model(classifier)
    train_model.compile(keras.optimizers.Adam(1e-3), HypersphericalPullLoss())
    return train_model, classifier


def run(method, dim, seed, epochs, x, y, x_test, y_test, width, batch_size, batch_frequency):
    keras.utils.set_random_seed(seed)
    train_model, predictor = build(method, dim, width)
    callbacks, inputs = [], x
    if method != "softmax":
        inputs = [x, y]
    if method == "dynamic":
        callbacks.append(PrototypeReassignment())
    if method == "dynamic_steps":
        callbacks.append(PrototypeReassignment(batch_frequency=batch_frequency))
    start = time.time()
    history = train_model.fit(inputs, y, epochs=epochs, batch_size=batch_size, verbose=2, callbacks=callbacks)
    predictions = np.argmax(predictor.predict(x_test, batch_size=512, verbose=0), axis=1)
    result = {"method": method, "dim": dim, "seed": seed, "epochs": epochs,
              "test_accuracy": float(np.mean(predictions == y_test)), "train_seconds": time.time() - start,
              "final_loss": float(history.history["loss"][-1])}
    if method.startswith("dynamic"):
        result["prototype_changes"] = [int(c) for c in history.history["prototype_changes"]]
    print(json.dumps(result), flush=True)
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", type=int, nargs="+", default=[3, 8])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--methods", nargs="+", default=["dynamic", "dynamic_steps", "fixed", "softmax"],
                        choices=["dynamic", "dynamic_steps", "fixed", "softmax"])
    parser.add_argument("--epochs", type=positive_int, default=6)
    parser.add_argument("--train", type=int, default=20000)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batch-frequency", type=int, default=10,
                        help="dynamic_steps: re-assign every this many batches as well as every epoch")
    parser.add_argument("--out", default=None,
                        help="the JSON file written, for one --dims value (default: "
                             "experiments/results/dl2pa_fashion_mnist_d{d}.json per d)")
    args = parser.parse_args()
    if args.out is not None and len(args.dims) > 1:
        parser.error("argument --out: names one file, for one --dims value; without it each d has its own file")
    x, y = load_fashion_mnist("train", limit=args.train)
    x_test, y_test = load_fashion_mnist("test")
    results = {dim: [] for dim in args.dims}
    for seed in args.seeds:
        for dim in args.dims:
            for method in args.methods:
                results[dim].append(run(method, dim, seed, args.epochs, x, y, x_test, y_test, args.width,
                                        args.batch_size, args.batch_frequency))
                out = args.out or os.path.join("experiments", "results", f"dl2pa_fashion_mnist_d{dim}.json")
                os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
                with open(out, "w") as f:
                    json.dump({"args": vars(args), "results": results[dim]}, f, indent=1)
    print("\n| d | method | seed | test acc |\n|---|---|---|---|")
    for runs in results.values():
        for r in runs:
            print(f"| {r['dim']} | {r['method']} | {r['seed']} | {r['test_accuracy']:.4f} |")


if __name__ == "__main__":
    main()
