"""Does the Multi-Proxy Wasserstein head learn? MPW vs global average pooling + Dense on Fashion-MNIST.

Same backbone (small_convnet), seed, data order, optimizer (Adam 1e-3), batch size and number of epochs for both
heads; test accuracy on the full 10k test set. The models are ``zoo.image_classifier`` (heads ``gap_fc`` and
``mpw``, small_convnet with BatchNorm momentum 0.9, unnormalized images: ``zoo_inputs.RAW_PIXELS``). Writes
experiments/results/mpw_vs_gap.json (or --out). The recorded runs (docs/results/sinkhorn_mpw.md):

    python experiments/mpw_vs_gap.py --epochs 3 --train 15000 --seeds 0
    python experiments/mpw_vs_gap.py --epochs 5 --train 15000 --seeds 0 \
        --out experiments/results/mpw_vs_gap_5epochs.json
"""
import argparse
import json
import os
import time

import keras
import numpy as np

import zoo
from training.recipes.simple_classifier import compile_classifier, fit_and_evaluate
from training.data.fashion_mnist import load_fashion_mnist
from zoo_inputs import small_convnet_options
from otzoo.arguments import positive_int

ZOO_HEADS = {"gap": "gap_fc", "mpw": "mpw"}  # this experiment's head names -> zoo.image_classifier's


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=positive_int, default=3)
    parser.add_argument("--train", type=int, default=20000, help="training images (the first N)")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "mpw_vs_gap.json"))
    args = parser.parse_args()

    train = load_fashion_mnist("train", limit=args.train)
    test = load_fashion_mnist("test")
    runs = []
    for seed in args.seeds:
        for head in ("gap", "mpw"):
            keras.utils.set_random_seed(seed)
            model = compile_classifier(zoo.image_classifier("small_convnet", ZOO_HEADS[head], 10,
                                                            **small_convnet_options(args.width, feature_dim=64)))
            start = time.time()
            accuracy, history = fit_and_evaluate(model, train, test, epochs=args.epochs, seed=seed, verbose=2)
            runs.append({"head": head, "seed": seed, "test_accuracy": accuracy, "train_loss": history["loss"],
                         "seconds": time.time() - start, "parameters": model.count_params()})
            print(json.dumps(runs[-1]), flush=True)
    summary = {head: float(np.mean([r["test_accuracy"] for r in runs if r["head"] == head])) for head in ("gap", "mpw")}
    report = {"config": vars(args), "runs": runs, "mean_test_accuracy": summary,
              "mpw_at_least_gap": summary["mpw"] >= summary["gap"]}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"mean test accuracy: GAP+Dense {summary['gap']:.4f}, MPW {summary['mpw']:.4f}; wrote {args.out}")


if __name__ == "__main__":
    main()
