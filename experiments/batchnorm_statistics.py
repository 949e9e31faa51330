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

from epoch_budget import recalibrate
from mpw_vs_gap import ZOO_HEADS, build_model, data_order, load_splits
from otzoo.arguments import positive_int

BATCH = 250


def accuracy(model, images, labels, training):
    """Accuracy and per-class accuracy of ``model`` on ``images`` in batches of ``BATCH``; ``training=True``
    normalizes each batch by its own statistics."""
    predicted = np.concatenate([keras.ops.convert_to_numpy(model(images[i:i + BATCH], training=training))
                                for i in range(0, len(images), BATCH)]).argmax(axis=1)
    return {"accuracy": float((predicted == labels).mean()),
            "per_class": [float((predicted[labels == c] == c).mean()) for c in range(10)]}


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
    (x_train, y_train), (x_val, y_val) = load_splits(args.train, args.validation)
    model = build_model(args.head, args.seed, 32, bn_momentum=args.bn_momentum)
    order = data_order(args.seed, len(x_train))
    model.fit(x_train[order], y_train[order], epochs=args.epochs, batch_size=64, shuffle=True, verbose=2)
    record = {"head": args.head, "seed": args.seed, "epochs": args.epochs, "bn_momentum": args.bn_momentum,
              "moving_statistics": accuracy(model, x_val, y_val, False),
              "batch_statistics": accuracy(model, x_val, y_val, True)}
    recalibrate(model, x_train[order][:args.recalibrate])
    record["recalibrated_statistics"] = dict(accuracy(model, x_val, y_val, False), images=args.recalibrate)
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
