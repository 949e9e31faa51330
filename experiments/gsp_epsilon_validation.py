"""Choose the GSP retrieval preset's epsilon on a validation split of the seen classes (Gurbuz 2022, ch. 5).

The retrieval presets train on Fashion-MNIST classes 0-4 and are scored on the unseen classes 5-9. Choosing GSP's
entropic regularization ``epsilon`` (``1 / gamma``) on classes 5-9 would tune on the test classes, so this script
splits the *seen* classes the same way: it trains on the training images of classes 0-2 and scores cosine retrieval
(MAP@R, P@1) among held-out training images of classes 3-4 (the first ``--val-per-class`` of each). The test split
is never read.

Every run uses the retrieval presets' own recipe (``training.recipes.retrieval.fit_embedding``: ResNet-20,
ProxyNCA++ at temperature 0.1, SGD 0.1 with a cosine decay, L2 5e-4, pad-crop-flip, 4 epochs, batch 128, seed),
so the only difference between runs is the pooling: the GAP preset's architecture, and the GSP preset's with each
``epsilon`` of ``--epsilons``. The thesis' values: ``gamma = 0.5`` (epsilon 2.0) with proxy losses, ``gamma = 5``
(epsilon 0.2) with pair losses; smaller epsilon = sharper selection.

Results go to ``experiments/results/gsp_epsilon_validation.json`` (runs already there are kept, so a killed run
resumes with the missing ones), with the selected epsilon (best validation MAP@R among the GSP runs).

    python experiments/gsp_epsilon_validation.py [--epsilons 2.0 0.5 0.2 0.1 --seed 0 --epochs 4]

The grid's extension below 0.1 (with Newton's method for the transport, which converges there within the layer's
``max_iter``) and its second seed are in ``experiments/results/gsp_epsilon_validation_newton.json``:

    python experiments/gsp_epsilon_validation.py --epsilons 0.1 0.05 0.03 0.01 --seed 0 \
        --output experiments/results/gsp_epsilon_validation_newton.json
    python experiments/gsp_epsilon_validation.py --epsilons 0.1 0.05 --seed 1 --skip-gap \
        --output experiments/results/gsp_epsilon_validation_newton.json
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from training.data.fashion_mnist import fashion_mnist_split
from training.recipes.common import preset_recipe
from training.recipes.retrieval import fit_embedding, retrieval_scores
from training.distributed.strategies import make_strategy
from training.tuning.search import held_out_classes_split

GAP, GSP = "resnet20_gap_retrieval_fashion_mnist", "resnet20_gsp_retrieval_fashion_mnist"
FIT_CLASSES, VALIDATION_CLASSES = (0, 1, 2), (3, 4)
OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "gsp_epsilon_validation.json")


def seen_class_split(val_per_class):
    """``(fit images, fit labels 0..2), (validation images, labels 3/4)``: training images only (the split of
    ``otzoo tune`` for retrieval presets, ``training.tuning.held_out_classes_split``)."""
    images, labels = fashion_mnist_split("retrieval", "train", normalize=False)  # classes 0-4, original labels
    return held_out_classes_split(images, labels, fraction=len(VALIDATION_CLASSES) / 5, per_class=val_per_class)


def run_key(run):
    return f"{run['pooling']}:{run.get('epsilon')}:{run['seed']}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[2.0, 0.5, 0.2, 0.1])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=None, help="default: the presets' recipe (4)")
    parser.add_argument("--val-per-class", type=int, default=1000)
    parser.add_argument("--skip-gap", action="store_true",
                        help="leave out the GAP reference run (when only GSP's epsilons are compared)")
    parser.add_argument("--output", default=OUTPUT)
    args = parser.parse_args()

    results = json.load(open(args.output)) if os.path.exists(args.output) else dict(runs=[])
    done = {run_key(r) for r in results["runs"]}
    (x_fit, y_fit), (x_val, y_val) = seen_class_split(args.val_per_class)
    strategy = make_strategy("auto")
    plans = ([] if args.skip_gap else [(GAP, "gap", None)]) + [(GSP, "gsp", eps) for eps in args.epsilons]
    for preset, pooling, epsilon in plans:
        run = dict(pooling=pooling, epsilon=epsilon, seed=args.seed)
        if run_key(run) in done:
            continue
        recipe = preset_recipe(preset, epochs=args.epochs, seed=args.seed)
        overrides = {} if epsilon is None else dict(epsilon=epsilon)
        model, seconds = fit_embedding(preset, x_fit, y_fit, recipe, strategy, overrides)
        run.update(validation=retrieval_scores(model, x_val, y_val), train_seconds=round(seconds, 1),
                   epochs=recipe.epochs)
        print(json.dumps(run), flush=True)
        results["runs"].append(run)
        gsp_runs = [r for r in results["runs"] if r["pooling"] == "gsp"]
        best = max(gsp_runs, key=lambda r: r["validation"]["map_at_r"]) if gsp_runs else None
        results.update(
            protocol=dict(fit="training images of classes 0-2", validation=f"first {args.val_per_class} training "
                          "images of classes 3 and 4, cosine retrieval, each a query against all others",
                          recipe="the retrieval presets' (training.recipes.retrieval.fit_embedding)",
                          command="python experiments/gsp_epsilon_validation.py"),
            selected_epsilon=None if best is None else best["epsilon"])
        os.makedirs(os.path.dirname(args.output), exist_ok=True)
        with open(args.output + ".tmp", "w") as handle:
            json.dump(results, handle, indent=2)
        os.replace(args.output + ".tmp", args.output)
    print("selected epsilon:", results.get("selected_epsilon"))


if __name__ == "__main__":
    main()
