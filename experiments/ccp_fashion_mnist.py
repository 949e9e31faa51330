"""CCP on Fashion-MNIST zero-shot retrieval (train on classes 0-4, test on 5-9), with ProxyAnchor as inner loss.

Class-balanced batches (5 classes x 12), short epochs of 25 steps, one validation MAP@R per epoch (1,000
held-out training images of classes 0-4). Variants (same data, seed, steps; all keep the best-validation weights):
``proxy_anchor`` (no re-initialization), ``ccp_random`` (re-init by random sampling, pool = P),
``ccp_kcenter`` (greedy k-center from a pool of ``--pool`` per class, proximal penalty lambda = 2e-4 in the loss),
``ccp_kcenter_no_prox`` (same, lambda = 0). The network is ``zoo.embedding_model`` (``zero_shot_setup``) with
``zoo.proxy_training_model``'s ``ClassProxies``. Writes experiments/results/ccp_fashion_mnist.json.

    PYTHONPATH=. python experiments/ccp_fashion_mnist.py
"""
import argparse
import json
import os
import time

import keras

import zoo
from ot_layers.callbacks import CCPReinitialization
from ot_layers.losses import ProxyAnchorLoss
from training.evaluation.retrieval import retrieval_metrics
from training.data.samplers import ClassBalancedBatches
from zero_shot_setup import embedding_network, retrieval, seed_everything, zero_shot_data
from otzoo.arguments import positive_int


def run(variant, data, args):
    (x, y), (x_val, y_val), (x_test, y_test) = data
    seed_everything(args.seed)
    embed = embedding_network(args.dim, width=args.width)
    model = zoo.proxy_training_model(embed, 5, num_proxies=args.proxies)
    model.compile(keras.optimizers.Adam(args.lr), ProxyAnchorLoss())
    plateau = dict(patience=args.patience, min_delta=args.min_delta)
    settings = {"proxy_anchor": dict(patience=10 ** 6, pool_size=args.proxies, proximal=0.0),
                "ccp_random": dict(plateau, pool_size=args.proxies, proximal=2e-4),
                "ccp_kcenter": dict(plateau, pool_size=args.pool, proximal=2e-4),
                "ccp_kcenter_no_prox": dict(plateau, pool_size=args.pool, proximal=0.0)}[variant]

    def validation_map_at_r():
        return retrieval_metrics(embed.predict(x_val, batch_size=512, verbose=0), y_val, ks=(1,),
                                 nmi=False)["map_at_r"]

    ccp = CCPReinitialization(x, y, validation_map_at_r, embedding_model=embed, seed=args.seed, **settings)
    start = time.time()
    batches = ClassBalancedBatches(x, y, classes_per_batch=5, samples_per_class=args.samples_per_class,
                                   steps_per_epoch=args.steps_per_epoch, seed=args.seed)
    model.fit(batches, epochs=args.epochs, verbose=2, shuffle=False, callbacks=[ccp, batches.epoch_callback()])
    result = {"variant": variant, **settings, "reinitializations": ccp.reinitializations,
              "val_map_at_r": [round(v, 4) for v in ccp.history], "test": retrieval(embed, x_test, y_test),
              "seconds": round(time.time() - start, 1)}
    print(json.dumps(result), flush=True)
    return result


def main():
    parser = argparse.ArgumentParser()
    variants = ["proxy_anchor", "ccp_random", "ccp_kcenter", "ccp_kcenter_no_prox"]
    parser.add_argument("--variants", nargs="+", default=variants, choices=variants)
    parser.add_argument("--epochs", type=positive_int, default=24, help="short epochs: one validation MAP@R each")
    parser.add_argument("--steps-per-epoch", type=int, default=25)
    parser.add_argument("--samples-per-class", type=int, default=12, help="class-balanced batches of 5 x this")
    parser.add_argument("--patience", type=int, default=2)
    parser.add_argument("--min-delta", type=float, default=0.002)
    parser.add_argument("--proxies", type=int, default=4)
    parser.add_argument("--pool", type=int, default=12)
    parser.add_argument("--train", type=int, default=12000, help="first N training images (classes 0-4 kept)")
    parser.add_argument("--val", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="experiments/results/ccp_fashion_mnist.json")
    args = parser.parse_args()
    data = zero_shot_data(args.train, val_size=args.val)
    results = []
    for variant in args.variants:
        results.append(run(variant, data, args))
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    print("\n| variant | re-inits | test MAP@R | test R@1 | test NMI |\n|---|---|---|---|---|")
    for r in results:
        t = r["test"]
        print(f"| {r['variant']} | {r['reinitializations']} | {t['map_at_r']:.4f} | {t['precision_at_1']:.4f} | "
              f"{t['nmi']:.4f} |")


if __name__ == "__main__":
    main()
