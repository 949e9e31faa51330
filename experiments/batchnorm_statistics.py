"""How much of a small-ConvNet classifier's accuracy its BatchNorm moving statistics cost: validation accuracy in
inference mode (the moving statistics, what a user's ``predict`` gets) against the same weights with each batch's
own statistics (``training=True``, batches of 250), and in inference mode after recalibration (every BatchNorm's
moving statistics replaced by those of ``--recalibrate`` training images in one pass), overall and per class.

The run is ``experiments/mpw_vs_gap.py``'s (same model, seed, data order and validation images: the last 5,000 of
the training split), stopped after ``--epochs``: its inference-mode accuracy equals that script's validation
accuracy at the same epoch. Written to explain that comparison's GAP seed 1 (docs/results/sinkhorn_mpw.md):

    python experiments/batchnorm_statistics.py --head gap --seed 1 --epochs 3
    python experiments/batchnorm_statistics.py --head mpw --seed 1 --epochs 3
    python experiments/batchnorm_statistics.py --head gap --seed 1 --epochs 3 --bn-momentum 0.99
"""
import argparse
import json
import os

import keras
import numpy as np

import zoo
from mpw_vs_gap import ZOO_HEADS
from otzoo.arguments import positive_int
from training.data.fashion_mnist import load_fashion_mnist
from training.recipes.simple_classifier import compile_classifier
from zoo_inputs import small_convnet_options

BATCH = 250


def predictions(model, images, training):
    return np.concatenate([keras.ops.convert_to_numpy(model(images[i:i + BATCH], training=training))
                           for i in range(0, len(images), BATCH)]).argmax(axis=1)


def recalibrate(model, images):
    """Sets every BatchNormalization's moving statistics to those of ``images``: one training-mode pass over all of
    them at once with momentum 0, so that each layer's statistics are taken on inputs normalized the same way."""
    norms = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0
    model(images, training=True)
    for layer, momentum in zip(norms, momenta):
        layer.momentum = momentum


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", choices=sorted(ZOO_HEADS), required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--train", type=positive_int, default=15000)
    parser.add_argument("--validation", type=positive_int, default=5000)
    parser.add_argument("--bn-momentum", type=float, default=0.9,
                        help="BatchNorm's moving-statistics momentum (0.9: the comparison's; 0.99: Keras' default)")
    parser.add_argument("--recalibrate", type=positive_int, default=2000,
                        help="training images whose statistics replace the moving ones (the first N of the run's)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "batchnorm_statistics.json"))
    args = parser.parse_args()
    x, y = load_fashion_mnist("train")
    x_train, y_train = x[:args.train], y[:args.train]
    x_val, y_val = x[-args.validation:], y[-args.validation:]
    keras.utils.set_random_seed(args.seed)
    model = compile_classifier(zoo.image_classifier("small_convnet", ZOO_HEADS[args.head], 10,
                                                    **small_convnet_options(32, feature_dim=64,
                                                                          bn_momentum=args.bn_momentum)))
    order = np.random.default_rng(args.seed).permutation(len(x_train))
    model.fit(x_train[order], y_train[order], epochs=args.epochs, batch_size=64, shuffle=True, verbose=2)
    record = {"head": args.head, "seed": args.seed, "epochs": args.epochs, "bn_momentum": args.bn_momentum}
    for mode, training in (("moving_statistics", False), ("batch_statistics", True)):
        predicted = predictions(model, x_val, training)
        record[mode] = {"accuracy": float((predicted == y_val).mean()),
                        "per_class": [float((predicted[y_val == c] == c).mean()) for c in range(10)]}
    recalibrate(model, x_train[order][:args.recalibrate])
    predicted = predictions(model, x_val, False)
    record["recalibrated_statistics"] = {"accuracy": float((predicted == y_val).mean()),
                                         "per_class": [float((predicted[y_val == c] == c).mean()) for c in range(10)],
                                         "images": args.recalibrate}
    print(json.dumps(record), flush=True)
    records = []
    if os.path.exists(args.out):
        with open(args.out) as handle:
            records = [r for r in json.load(handle)
                       if (r["head"], r["seed"], r["epochs"], r.get("bn_momentum", 0.9))
                       != (args.head, args.seed, args.epochs, args.bn_momentum)]
    with open(args.out, "w") as handle:
        json.dump(records + [record], handle, indent=2)


if __name__ == "__main__":
    main()
