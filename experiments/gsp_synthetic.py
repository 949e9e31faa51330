"""The thesis' synthetic token study (Gurbuz 2022, Sec. 5.3.1): GAP vs GSP, MAP@R.

16 classes, each with 4 trainable tokens, plus 4 background tokens shared by all classes. A sample is 50 tokens:
a fraction ``mu~ ~ N(0.5, 0.1)`` drawn (with replacement) from its class tokens, the rest from the background
tokens. Token vectors are trainable, clipped to [-0.3, 0.3]; the pooled representation is not L2-normalized; Adam
1e-4; batches of 4 samples x 16 classes; early stopping on validation MAP@R with patience 30 epochs. The same
tokens' initialization, samples, loss and budget are used for GAP and GSP; MAP@R (Euclidean) is reported on a
separate test set of fresh samples, at the epoch with the best validation MAP@R.

Choices the thesis leaves open or that the CPU budget sets (stated here): token dimension 2 (its Fig. 5.4 is 2-d),
contrastive loss (C2) on raw Euclidean distances with margins (0, 0.15) (16 classes must fit in the
[-0.3, 0.3]^2 box), 20 steps per epoch, at most ``--max-epochs`` epochs (the summary counts the runs that reached it
without stopping early), GSP with 16 prototypes, mu = 0.3 and epsilon = 0.05
(gamma = 20; the thesis' gamma = 5, epsilon = 0.2, is meant for unit-scale features; the tokens here are
0.3-scale, so epsilon = 0.2 would make the selection nearly uniform).

The summary gives each pooling's mean and sample sd over the seeds and GSP minus GAP paired by seed (same tokens'
initialization and samples), with a paired t-test. The recorded run (docs/results/gsp.md):

    python experiments/gsp_synthetic.py --seeds 0 1 2 3 4 --max-epochs 1500 \
        --output experiments/results/gsp_synthetic_seeds.json
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from ot_layers import GeneralizedSumPooling  # noqa: E402
from ot_layers.losses import ContrastiveLoss  # noqa: E402
from training.evaluation.retrieval import retrieval_metrics  # noqa: E402
from seed_runs import paired_differences, spread  # noqa: E402

NUM_CLASSES, TOKENS_PER_CLASS, BACKGROUND_TOKENS, SAMPLE_LENGTH = 16, 4, 4, 50


def sample_tokens(labels, rng):
    """Token ids ``(N, 50)``: ``round(50 mu~)`` class tokens (``mu~ ~ N(0.5, 0.1)``, clipped), the rest background."""
    background_start = NUM_CLASSES * TOKENS_PER_CLASS
    out = np.empty((len(labels), SAMPLE_LENGTH), np.int32)
    for i, c in enumerate(labels):
        count = int(round(SAMPLE_LENGTH * np.clip(rng.normal(0.5, 0.1), 0.0, 1.0)))
        class_ids = c * TOKENS_PER_CLASS + rng.integers(0, TOKENS_PER_CLASS, size=count)
        background_ids = background_start + rng.integers(0, BACKGROUND_TOKENS, size=SAMPLE_LENGTH - count)
        out[i] = rng.permutation(np.concatenate([class_ids, background_ids]))
    return out


def build_model(pooling, dim, epsilon, seed):
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((SAMPLE_LENGTH,), dtype="int32")
    embedded = keras.layers.Embedding(
        NUM_CLASSES * TOKENS_PER_CLASS + BACKGROUND_TOKENS, dim,
        embeddings_initializer=keras.initializers.RandomUniform(-0.3, 0.3, seed=seed),
        embeddings_constraint=lambda w: keras.ops.clip(w, -0.3, 0.3), name="tokens")(tokens)
    if pooling == "gap":
        pooled = keras.layers.GlobalAveragePooling1D()(embedded)
    else:
        pooled = GeneralizedSumPooling(num_prototypes=16, transport_ratio=0.3, epsilon=epsilon,
                                       initializer=keras.initializers.RandomUniform(-0.3, 0.3, seed=seed),
                                       name="gsp")(embedded)
    return keras.Model(tokens, pooled)


def run(pooling, seed, args):
    rng = np.random.default_rng(seed)
    val_labels = np.repeat(np.arange(NUM_CLASSES), args.eval_per_class)
    test_labels = np.repeat(np.arange(NUM_CLASSES), args.eval_per_class)
    val_x, test_x = sample_tokens(val_labels, rng), sample_tokens(test_labels, rng)
    train_rng = np.random.default_rng(seed + 1000)
    model = build_model(pooling, args.dim, args.epsilon, seed)
    loss_fn = ContrastiveLoss(pos_margin=args.pos_margin, neg_margin=args.neg_margin, normalize=False)
    optimizer = keras.optimizers.Adam(args.learning_rate)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(grads, model.trainable_weights))
        return loss

    embed = tf.function(lambda x: model(x, training=False))
    best, best_epoch, best_test, history = -1.0, -1, None, []
    start = time.perf_counter()
    for epoch in range(args.max_epochs):
        for _ in range(args.steps_per_epoch):
            y = np.repeat(np.arange(NUM_CLASSES), 4).astype(np.int32)  # 4 samples x 16 classes
            train_step(tf.constant(sample_tokens(y, train_rng)), tf.constant(y))
        val = retrieval_metrics(embed(val_x).numpy(), val_labels, metric="euclidean", nmi=False)["map_at_r"]
        history.append(val)
        if val > best:
            best, best_epoch = val, epoch
            best_test = retrieval_metrics(embed(test_x).numpy(), test_labels, metric="euclidean", nmi=False)
        elif epoch - best_epoch >= args.patience:
            break
    return {"pooling": pooling, "seed": seed, "best_epoch": best_epoch, "epochs_run": len(history),
            "val_map_at_r": best, "test_map_at_r": best_test["map_at_r"],
            "test_precision_at_1": best_test["precision_at_1"], "seconds": time.perf_counter() - start}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--dim", type=int, default=2)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--epsilon", type=float, default=0.05, help="GSP's entropic regularization (1 / gamma)")
    parser.add_argument("--pos-margin", type=float, default=0.0)
    parser.add_argument("--neg-margin", type=float, default=0.15)
    parser.add_argument("--steps-per-epoch", type=int, default=20)
    parser.add_argument("--max-epochs", type=int, default=150)
    parser.add_argument("--patience", type=int, default=30)
    parser.add_argument("--eval-per-class", type=int, default=32)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(__file__), "results", "gsp_synthetic.json"))
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        for pooling in ("gap", "gsp"):
            runs.append(run(pooling, seed, args))
            r = runs[-1]
            print(f"seed {seed} {pooling}: test MAP@R {r['test_map_at_r']:.4f} P@1 {r['test_precision_at_1']:.4f} "
                  f"(best epoch {r['best_epoch']} of {r['epochs_run']}, {r['seconds']:.0f}s)", flush=True)
            with open(args.output, "w") as handle:  # every finished run at once
                json.dump({"config": vars(args), "runs": runs}, handle, indent=2)
    summary = summarize(runs, args)
    with open(args.output, "w") as handle:
        json.dump({"config": vars(args), "runs": runs, "mean": summary}, handle, indent=2)
    print(f"mean over seeds: GAP MAP@R {summary['gap']['test_map_at_r']:.4f}, "
          f"GSP MAP@R {summary['gsp']['test_map_at_r']:.4f}; GSP - GAP "
          f"{summary['gsp_minus_gap']['mean'] * 100:+.2f} +- {(summary['gsp_minus_gap']['sd'] or 0) * 100:.2f} points "
          f"(GSP ahead in {summary['gsp_minus_gap']['gsp_ahead_in']} of {len(args.seeds)})")


def summarize(runs, args):
    """Per pooling: mean and sample sd of the test metrics over the seeds, and how many runs reached the epoch cap
    still improving; GSP - GAP MAP@R paired by seed, with ``scipy.stats.ttest_rel``'s p-value."""
    summary = {}
    for pooling in ("gap", "gsp"):
        mine = [r for r in runs if r["pooling"] == pooling]
        summary[pooling] = {"at_epoch_cap": sum(r["epochs_run"] == args.max_epochs for r in mine)}
        for key in ("test_map_at_r", "test_precision_at_1"):
            summary[pooling][key], summary[pooling][key + "_sd"] = spread([r[key] for r in mine])
    gap = [r["test_map_at_r"] for r in runs if r["pooling"] == "gap"]
    gsp = [r["test_map_at_r"] for r in runs if r["pooling"] == "gsp"]
    difference = paired_differences(np.subtract(gsp, gap).tolist())
    summary["gsp_minus_gap"] = {"map_at_r": difference["per_seed"], "mean": difference["mean"],
                                "sd": difference["sd"], "gsp_ahead_in": int(difference["positive_in"].split("/")[0]),
                                "ttest_rel_p": difference["paired_t_p"]}
    return summary


if __name__ == "__main__":
    main()
