"""Fashion-MNIST few-shot: DeepEMD's EMDHead vs ProtoNet with the same backbone (Zhang et al. 2022).

Base classes 0-4 (train split, subsampled): pre-train a classifier (backbone + GAP + softmax), then meta-train two
copies on 5-way 1-shot episodes (15 queries per class), one with the EMD head (entropic method), one with ProtoNet's
cosine-on-GAP logits. Novel classes 5-9 (test split): 5-way K-shot episodes on frozen features, every classifier
scored on the same episodes; mean accuracy +- 95 % CI.

  --shots 1: ProtoNet, EMD cross-reference vs uniform weights (entropic); on the first --exact-episodes of the
             same episodes, the exact method vs the entropic one (meta-trained backbone).
  --shots 5: ProtoNet (every backbone), EMD on the class-mean node set ("merge") with cross-reference / uniform
             weights (pre-trained and EMD-meta-trained backbones), and on --sfc-episodes episodes the structured FC
             fine-tuned by SGD vs nearest neighbour (best EMD over the shots) vs merge (EMD-meta-trained backbone).

The models are the zoo's: pre-training ``zoo.image_classifier(backbone, "gap_fc")``, meta-training
``zoo.few_shot_model(backbone, "emd" | "protonet")`` (heads ``EMDHead(method="sinkhorn", scale=12.5)`` and
``PrototypeLogits(metric="cosine", scale=12.5)`` on the class means ``SupportClassMeans``) by
``training.recipes.few_shot.meta_train`` (Adam 5e-4, one episode a step, not XLA-compiled), all on unnormalized images
(``zoo_inputs.RAW_PIXELS``). Meta-training episode ``i`` is ``EpisodeSampler(...).episode(i)``, and query and
support images go through the backbone as one batch in the order [query; support]. ``--seed`` makes a whole
replicate (the base-image subsample, initialization, meta-training and test episodes);
``experiments/emd_fewshot_seeds.py`` summarizes the seeds' runs.

Pre-trained and meta-trained weights are cached in --cache (re-used by the second run); meta-training is
checkpointed there too (``{emd,proto}_meta_checkpoints``: an interrupted run resumes; delete --cache to retrain with
other arguments; each seed has its own). Writes experiments/results/emd_fewshot_{K}shot[_seedS].json.
Run: ``PYTHONPATH=. python experiments/emd_fewshot.py --shots 1``.
"""
import argparse
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

import zoo
from ot_layers import EMDHead
from training.data.fashion_mnist import load_fashion_mnist
from training.data.splits import select_classes
from training.evaluation.few_shot import evaluate_episodes
from training.recipes.few_shot import meta_train
from training.evaluation.structured_fc import class_mean_nodes, fine_tune_nodes
from zoo import small_convnet
from zoo_inputs import RAW_PIXELS

BASE, NOVEL = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]
WAYS, QUERIES, SCALE = 5, 15, 12.5
HEAD_KWARGS = {"emd": {"method": "sinkhorn", "scale": SCALE}, "protonet": {"metric": "cosine", "scale": SCALE}}


def build_backbone():
    return small_convnet((28, 28, 1), width=32, feature_dim=64)


def pretrain(x, y, epochs, seed):
    """``zoo.image_classifier(backbone, "gap_fc")`` trained on the base classes; returns the backbone."""
    keras.utils.set_random_seed(seed)
    backbone = build_backbone()
    model = zoo.image_classifier(backbone, "gap_fc", len(BASE), **RAW_PIXELS)
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(x, y, batch_size=128, epochs=epochs, verbose=2)
    return backbone, {k: [float(v) for v in vals] for k, vals in history.history.items()}


def few_shot_model(backbone, head):
    """``zoo.few_shot_model`` with ``head`` ("emd" or "protonet") on ``backbone`` (shared weights)."""
    return zoo.few_shot_model(backbone, head, WAYS, head_kwargs=HEAD_KWARGS[head], **RAW_PIXELS)


def protonet_fn():
    """ProtoNet's logits on feature maps, ``fn(support_maps, support_label, query_maps)``: the zoo's "protonet"
    head (the class means of the GAP support features, ``PrototypeLogits``: cosine x 12.5)."""
    means = zoo.SupportClassMeans(WAYS)
    logits = zoo.PrototypeLogits(**HEAD_KWARGS["protonet"])

    @tf.function
    def classify(support_maps, support_label, query_maps):
        support, query = tf.reduce_mean(support_maps, axis=[1, 2]), tf.reduce_mean(query_maps, axis=[1, 2])
        return logits([query, means([support, support_label])])
    return lambda s, sl, q: classify(s, tf.constant(sl, tf.int32), q)


def emd_head_fn(method="sinkhorn", node_weights="cross_reference"):
    head = EMDHead(scale=SCALE, method=method, node_weights=node_weights)
    return lambda support_maps, support_label, query_maps: head([query_maps, support_maps])


def features(backbone, x):
    return backbone.predict(x, batch_size=500, verbose=0)


def classifiers_1shot():
    sinkhorn_xref = tf.function(emd_head_fn("sinkhorn"), jit_compile=True)
    sinkhorn_uniform = tf.function(emd_head_fn("sinkhorn", "uniform"), jit_compile=True)
    return {
        "protonet": protonet_fn(),
        "emd_sinkhorn_cross_reference": lambda s, sl, q: sinkhorn_xref(s, sl, q),
        "emd_sinkhorn_uniform": lambda s, sl, q: sinkhorn_uniform(s, sl, q),
    }


def classifiers_exact():
    """The exact method next to the entropic one it approximates (network simplex on 375 problems per episode)."""
    exact_xref = tf.function(emd_head_fn("exact"))
    sinkhorn_xref = tf.function(emd_head_fn("sinkhorn"), jit_compile=True)
    return {"emd_exact_cross_reference": lambda s, sl, q: exact_xref(s, sl, q),
            "emd_sinkhorn_cross_reference": lambda s, sl, q: sinkhorn_xref(s, sl, q)}


def nearest_neighbour(head, shots):
    """Class score = the best EMD logit over the class's ``shots`` support samples (support grouped by class)."""
    def classify(support_maps, support_label, query_maps):
        logits = head([query_maps, support_maps])
        return tf.reduce_max(tf.reshape(logits, [-1, WAYS, shots]), axis=-1)
    return tf.function(classify, jit_compile=True)


def merge(head):
    """EMD against each class's mean support feature map (the structured FC's initialization, not trained)."""
    def classify(support_maps, support_label, query_maps):
        flat = tf.reshape(support_maps, [tf.shape(support_maps)[0], -1, support_maps.shape[-1]])
        return head([query_maps, class_mean_nodes(flat, support_label, WAYS)])
    return tf.function(classify, jit_compile=True)


def structured_fc(head, shots, steps):
    def classify(support_maps, support_label, query_maps):
        flat = tf.reshape(support_maps, [WAYS * shots, -1, support_maps.shape[-1]])
        nodes = fine_tune_nodes(head, flat, support_label, class_mean_nodes(flat, support_label, WAYS), steps=steps)
        return head([query_maps, nodes])
    return tf.function(classify, jit_compile=True)


def classifiers_5shot():
    xref = EMDHead(scale=SCALE, method="sinkhorn")
    uniform = EMDHead(scale=SCALE, method="sinkhorn", node_weights="uniform")
    merge_xref, merge_uniform = merge(xref), merge(uniform)
    return {
        "protonet": protonet_fn(),
        "emd_sinkhorn_merge_cross_reference": lambda s, sl, q: merge_xref(s, tf.constant(sl, tf.int32), q),
        "emd_sinkhorn_merge_uniform": lambda s, sl, q: merge_uniform(s, tf.constant(sl, tf.int32), q),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shots", type=int, choices=(1, 5), default=1)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--exact-episodes", type=int, default=200)
    parser.add_argument("--sfc-episodes", type=int, default=300)
    parser.add_argument("--sfc-steps", type=int, default=100)
    parser.add_argument("--train-limit", type=int, default=15000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--meta-episodes", type=int, default=200)
    parser.add_argument("--cache", default=None,
                        help="weights cache (default /tmp/otzoo_emd_fewshot, with _seedS for a seed S other than 0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None,
                        help="the JSON report (default experiments/results/emd_fewshot_{K}shot.json, with _seedS "
                             "before .json for a seed S other than 0)")
    args = parser.parse_args()
    suffix = f"_seed{args.seed}" if args.seed else ""  # one seed's weights are never another's
    args.cache = args.cache or f"/tmp/otzoo_emd_fewshot{suffix}"
    start = time.time()
    os.makedirs(args.cache, exist_ok=True)

    x_all, y_all = load_fashion_mnist("train")
    x_base, y_base = select_classes(x_all, y_all, BASE)
    rng = np.random.default_rng(args.seed)
    keep = rng.permutation(len(y_base))[:args.train_limit]
    x_base, y_base = x_base[keep], y_base[keep]
    x_test, y_test = load_fashion_mnist("test")
    x_novel, y_novel = select_classes(x_test, y_test, NOVEL)

    log = {"args": vars(args), "backbone": "small_convnet(width=32, feature_dim=64): 7x7x64 maps, 49 nodes"}
    backbones = {}
    paths = {name: os.path.join(args.cache, f"{name}.weights.h5") for name in ("pretrained", "emd_meta", "proto_meta")}
    if all(os.path.exists(p) for p in paths.values()):
        for name, path in paths.items():
            backbones[name] = build_backbone()
            backbones[name].load_weights(path)
        log["training"] = "loaded from cache " + args.cache
    else:
        pretrained, history = pretrain(x_base, y_base, args.epochs, args.seed)
        pretrained.save_weights(paths["pretrained"])
        log["pretrain_history"] = history
        for name, head in (("emd_meta", "emd"), ("proto_meta", "protonet")):
            backbone = build_backbone()
            backbone.load_weights(paths["pretrained"])
            history = meta_train(few_shot_model(backbone, head), x_base, y_base, args.meta_episodes,
                                 keras.optimizers.Adam(5e-4), WAYS, 1, QUERIES, seed=args.seed,
                                 checkpoint_dir=os.path.join(args.cache, f"{name}_checkpoints"), jit_compile=False,
                                 log_every=25, verbose=0)
            log[f"{name}_loss_every_25_episodes"] = history["loss"]
            log[f"{name}_query_accuracy_every_25_episodes"] = history["accuracy"]
            backbone.save_weights(paths[name])
            print(name, log[f"{name}_loss_every_25_episodes"], flush=True)
        backbones = {"pretrained": pretrained}
        for name in ("emd_meta", "proto_meta"):
            backbones[name] = build_backbone()
            backbones[name].load_weights(paths[name])
    log["training_seconds"] = time.time() - start

    results = {}
    for name, backbone in backbones.items():
        maps = features(backbone, x_novel)
        t0 = time.time()
        classifiers = {"protonet": protonet_fn()}
        if args.shots == 1 and name != "proto_meta":
            classifiers = classifiers_1shot()
        elif args.shots == 5 and name != "proto_meta":
            classifiers = classifiers_5shot()
        results[name] = evaluate_episodes(maps, y_novel, classifiers, WAYS, args.shots, QUERIES, args.episodes,
                                          seed=args.seed + 1)
        print(name, json.dumps(results[name]), f"{time.time() - t0:.0f}s", flush=True)
        if args.shots == 1 and name == "emd_meta" and args.exact_episodes:
            t0 = time.time()
            results["emd_meta_exact_vs_sinkhorn"] = evaluate_episodes(
                maps, y_novel, classifiers_exact(), WAYS, 1, QUERIES, args.exact_episodes, seed=args.seed + 1)
            print("exact", json.dumps(results["emd_meta_exact_vs_sinkhorn"]), f"{time.time() - t0:.0f}s", flush=True)
        if args.shots == 5 and name == "emd_meta" and args.sfc_episodes:
            head = EMDHead(scale=SCALE, method="sinkhorn")
            sfc = structured_fc(head, args.shots, args.sfc_steps)
            nn, mean_nodes = nearest_neighbour(head, args.shots), merge(head)
            t0 = time.time()
            results["emd_meta_sfc_comparison"] = evaluate_episodes(
                maps, y_novel, {
                    "structured_fc": lambda s, sl, q: sfc(s, tf.constant(sl, tf.int32), q),
                    "nearest_neighbour": lambda s, sl, q: nn(s, tf.constant(sl, tf.int32), q),
                    "merge": lambda s, sl, q: mean_nodes(s, tf.constant(sl, tf.int32), q),
                }, WAYS, args.shots, QUERIES, args.sfc_episodes, seed=args.seed + 2)
            print("sfc", json.dumps(results["emd_meta_sfc_comparison"]), f"{time.time() - t0:.0f}s", flush=True)
    log["results"] = results
    log["seconds"] = time.time() - start
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                   f"emd_fewshot_{args.shots}shot{suffix}.json")
    with open(out, "w") as handle:
        json.dump(log, handle, indent=2)
    print("wrote", out, f"total {log['seconds']:.0f}s")


if __name__ == "__main__":
    main()
