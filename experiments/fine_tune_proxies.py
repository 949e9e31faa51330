"""Should fine-tuning a retrieval preset start from fresh class proxies or from imprinted ones?

``otzoo fine-tune`` fits a retrieval preset's embedding by its recipe's proxy loss (ProxyNCA++, Teh et al. 2020) with
class proxies drawn at random: the packaged presets ship the embedding model, not the proxies they were trained with.
The alternative is to imprint them (Qi, Brown & Lowe 2018): each class's proxies start at the mean of the pretrained
model's L2-normalized embeddings of that class's images in the fine-tuning slice, so the loss starts low and the first
steps do not pull the embedding towards random directions. This script measures both on the same runs:

- the fine-tuning run of ``training.recipes.fine_tune.fine_tune_preset`` (its ``fine_tune_setup``: the first
  ``--limit`` training images, the seen classes 0-4, batches of 128 in the seed's order, SGD with momentum 0.9 at
  ``--learning-rate``, ``--epochs``), once with fresh proxies and once imprinted, for each seed of ``--seeds``;
- scored by cosine retrieval (MAP@R, P@1) among the training images of the *unseen* classes 5-9 in the last
  ``--validation`` training images: classes the fine-tuning never sees, as at test time, from the training split
  (the test split is never read), and the seen-class loss on the slice before and after (unaugmented).

Results go to ``experiments/results/fine_tune_proxies.json`` with the mean ± sd per preset and initialization and
the paired difference (imprinted - fresh) over seeds.

    python experiments/fine_tune_proxies.py [--seeds 0 1 2 3 4 --epochs 1 --limit 4096]
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from training.data.fashion_mnist import load_fashion_mnist, select_classes  # noqa: E402
from training.recipes.common import preset_spec  # noqa: E402
from training.recipes.fine_tune import BATCH_SIZE, QUERIES  # noqa: E402
from training.recipes.retrieval import embed, fine_tune_setup, retrieval_scores  # noqa: E402
from zoo.loading import load  # noqa: E402

PRESETS = ("resnet20_gap_retrieval_fashion_mnist", "resnet20_gsp_retrieval_fashion_mnist")
UNSEEN = (5, 6, 7, 8, 9)
INITS = ("fresh", "imprinted")
OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "fine_tune_proxies.json")


def imprint(trained, model, batches):
    """Set the ``proxies`` layer of ``trained`` to the class means of ``model``'s unit embeddings of ``batches``
    (every proxy of a class at its mean; the layer normalizes them)."""
    embeddings, labels = embed(model, batches)
    embeddings = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    layer = trained.get_layer("proxies")
    means = np.stack([embeddings[labels == k].mean(axis=0) for k in range(layer.num_classes)])
    layer.proxies.assign(np.repeat(means[:, None, :], layer.num_proxies, axis=1).astype("float32"))


def run(preset, init, seed, args, validation):
    keras.utils.set_random_seed(seed)
    model = load(preset)
    setup = fine_tune_setup(preset_spec(preset), model, args.limit, seed, BATCH_SIZE, QUERIES)
    if init == "imprinted":
        imprint(setup.trained, model, setup.evaluation)
    setup.trained.compile(optimizer=keras.optimizers.SGD(args.learning_rate, momentum=0.9), loss=setup.loss)
    before = float(setup.trained.evaluate(setup.evaluation, verbose=0))
    setup.trained.fit(setup.data, epochs=args.epochs, verbose=0, shuffle=False)
    after = float(setup.trained.evaluate(setup.evaluation, verbose=0))
    return dict(preset=preset, init=init, seed=seed, loss_before=round(before, 4), loss_after=round(after, 4),
                validation=retrieval_scores(model, *validation))


def summary(runs, seeds):
    def stats(values):
        return dict(mean=round(float(np.mean(values)), 4), sd=round(float(np.std(values, ddof=1)), 4)
                    if len(values) > 1 else None)
    out = {}
    for preset in PRESETS:
        by = {(r["init"], r["seed"]): r for r in runs if r["preset"] == preset}
        done = [s for s in seeds if all((i, s) in by for i in INITS)]
        if not done:
            continue
        entry = {init: {metric: stats([by[init, s]["validation"][metric] for s in done])
                        for metric in ("map_at_r", "precision_at_1")} for init in INITS}
        entry["imprinted_minus_fresh_map_at_r"] = stats(
            [by["imprinted", s]["validation"]["map_at_r"] - by["fresh", s]["validation"]["map_at_r"] for s in done])
        entry["seeds"] = done
        out[preset] = entry
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--limit", type=int, default=4096)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--validation", type=int, default=12000,
                        help="the last VALIDATION training images hold the unseen-class images scored")
    parser.add_argument("--output", default=OUTPUT)
    args = parser.parse_args()

    images, labels = load_fashion_mnist("train", normalize=False)
    validation = select_classes(images[-args.validation:], labels[-args.validation:], UNSEEN)
    results = json.load(open(args.output)) if os.path.exists(args.output) else dict(runs=[])
    done = {(r["preset"], r["init"], r["seed"]) for r in results["runs"]}
    results["pretrained"] = {p: retrieval_scores(load(p), *validation) for p in PRESETS}
    for preset in PRESETS:
        for seed in args.seeds:
            for init in INITS:
                if (preset, init, seed) in done:
                    continue
                result = run(preset, init, seed, args, validation)
                print(json.dumps(result), flush=True)
                results["runs"].append(result)
                results.update(
                    protocol=dict(fine_tuning=f"fine_tune_setup of otzoo fine-tune: first {args.limit} training "
                                  f"images (seen classes 0-4), SGD momentum 0.9 at {args.learning_rate}, "
                                  f"{args.epochs} epoch(s), batch {BATCH_SIZE}",
                                  validation=f"cosine retrieval among the {len(validation[0])} training images of "
                                             f"the unseen classes 5-9 in the last {args.validation} training "
                                             "images (the test split is never read)",
                                  command="python experiments/fine_tune_proxies.py", backend=keras.backend.backend()),
                    summary=summary(results["runs"], args.seeds))
                os.makedirs(os.path.dirname(args.output), exist_ok=True)
                with open(args.output + ".tmp", "w") as handle:
                    json.dump(results, handle, indent=2)
                os.replace(args.output + ".tmp", args.output)
    print(json.dumps(results.get("summary"), indent=2))


if __name__ == "__main__":
    main()
