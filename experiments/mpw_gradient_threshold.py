"""How far is the Multi-Proxy Wasserstein head's implicit gradient at its default stopping threshold from the
gradient at convergence?

The implicit gradient differentiates the Sinkhorn fixed point; the default ``threshold=0.1`` stops the loop at a
10 % row-marginal error, away from that fixed point. On the real 7x7x64 feature maps of a trained model (the
``resnet20_mpw_fashion_mnist`` preset) and its proxies, this script computes the cross-entropy gradient with
respect to the feature maps and the proxies at several thresholds and compares each with the gradient of a float64
solve run to ``threshold=1e-9`` (the converged reference): cosine similarity of the whole gradient, the relative
error of its norm, the per-sample cosine, the Sinkhorn iterations used, and the logits' agreement (max abs
difference, changed predictions, accuracy).

Part 2 (``--train-epochs N``) measures the accuracy effect of the threshold used in training: the small ConvNet +
MPW head trained with each threshold (same seed, data order, Adam 1e-3), over the given seeds.

    python experiments/mpw_gradient_threshold.py --images 512 --train-epochs 3 --train 15000 --seeds 0 1
"""
import argparse
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

from ot_layers import MultiProxyWasserstein

THRESHOLDS = (0.1, 0.03, 0.01, 1e-3)
REFERENCE = dict(threshold=1e-9, max_iter=5000, dtype="float64")


def head_like(head, threshold, max_iter, dtype="float32"):
    """A copy of ``head`` (same proxies and settings) that stops at ``threshold`` / ``max_iter``."""
    config = head.get_config()
    config.update(threshold=threshold, max_iter=max_iter, dtype=dtype, name=f"mpw_{threshold:g}")
    layer = MultiProxyWasserstein.from_config(config)
    layer.build((None, None, None, head.proxies.shape[-1]))
    layer.proxies.assign(tf.cast(head.proxies, layer.proxies.dtype))
    return layer


def gradients(layer, features, labels):
    """Logits, iterations used, and d(mean cross-entropy)/d(features, proxies) as float64 arrays."""
    x = tf.constant(features, dtype=layer.proxies.dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        logits = layer(x)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    d_x, d_p = tape.gradient(loss, [x, layer.proxies])
    flat = tf.reshape(tf.cast(x, tf.float32 if layer.proxies.dtype == tf.float32 else tf.float64),
                      [x.shape[0], -1, x.shape[-1]])
    _, _, result = layer.matcher.match(flat, layer.proxies)
    return dict(logits=logits.numpy().astype(np.float64), d_features=d_x.numpy().astype(np.float64),
                d_proxies=d_p.numpy().astype(np.float64),
                iterations=int(tf.reduce_max(result.iterations)),  # per problem: the batch's slowest one
                error=float(tf.reduce_max(result.error)))


def cosine(a, b):
    a, b = a.ravel(), b.ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def compare(run, reference, labels):
    per_sample = [cosine(a, b) for a, b in zip(run["d_features"], reference["d_features"])]
    return dict(
        iterations=run["iterations"], max_marginal_error=run["error"],
        cosine_d_features=cosine(run["d_features"], reference["d_features"]),
        cosine_d_proxies=cosine(run["d_proxies"], reference["d_proxies"]),
        relative_error_d_features=float(np.linalg.norm(run["d_features"] - reference["d_features"])
                                        / np.linalg.norm(reference["d_features"])),
        relative_error_d_proxies=float(np.linalg.norm(run["d_proxies"] - reference["d_proxies"])
                                       / np.linalg.norm(reference["d_proxies"])),
        per_sample_cosine_median=float(np.median(per_sample)), per_sample_cosine_min=float(np.min(per_sample)),
        max_abs_logit_difference=float(np.max(np.abs(run["logits"] - reference["logits"]))),
        changed_predictions=int(np.sum(run["logits"].argmax(-1) != reference["logits"].argmax(-1))),
        accuracy=float(np.mean(run["logits"].argmax(-1) == labels)),
    )


def gradient_study(preset, images, batch):
    import zoo
    from training.data.fashion_mnist import load_fashion_mnist

    model = zoo.load(preset)
    head = model.get_layer("mpw_head")
    extractor = keras.Model(model.inputs, head.input)
    x, y = load_fashion_mnist("test", limit=images, normalize=False)
    features = extractor.predict(x.astype(np.float32), batch_size=256, verbose=0)
    results = {}
    reference = {}
    for name, settings in [("reference", REFERENCE)] + [(f"{t:g}", dict(threshold=t, max_iter=head.matcher.max_iter))
                                                        for t in THRESHOLDS]:
        layer = head_like(head, **settings)
        parts = [gradients(layer, features[i:i + batch], y[i:i + batch]) for i in range(0, len(y), batch)]
        merged = dict(logits=np.concatenate([p["logits"] for p in parts]),
                      d_features=np.concatenate([p["d_features"] for p in parts]),
                      # batch-mean losses: the proxies' gradient of the mean over all images is the mean of batches
                      d_proxies=np.mean([p["d_proxies"] for p in parts], axis=0),
                      iterations=max(p["iterations"] for p in parts), error=max(p["error"] for p in parts))
        if name == "reference":
            reference = merged
            results[name] = dict(iterations=merged["iterations"], max_marginal_error=merged["error"],
                                 accuracy=float(np.mean(merged["logits"].argmax(-1) == y)))
        else:
            results[name] = compare(merged, reference, y)
        print(name, json.dumps(results[name]), flush=True)
    return dict(preset=preset, images=int(len(y)), batch=batch, feature_map=list(features.shape[1:]),
                reference=REFERENCE, results=results)


def training_study(thresholds, epochs, train_limit, seeds):
    from training.recipes.simple_classifier import compile_classifier, fit_and_evaluate
    from training.data.fashion_mnist import load_fashion_mnist
    import zoo
    from zoo_inputs import small_convnet_options

    train = load_fashion_mnist("train", limit=train_limit)
    test = load_fashion_mnist("test")
    runs = []
    for seed in seeds:
        for threshold in thresholds:
            keras.utils.set_random_seed(seed)
            model = compile_classifier(zoo.image_classifier("small_convnet", "mpw", 10,
                                                            head_kwargs={"threshold": threshold},
                                                            **small_convnet_options(32, feature_dim=64)))
            start = time.time()
            accuracy, history = fit_and_evaluate(model, train, test, epochs=epochs, seed=seed, verbose=0)
            runs.append(dict(threshold=threshold, seed=seed, test_accuracy=accuracy,
                             train_loss=[float(v) for v in history["loss"]], seconds=round(time.time() - start, 1)))
            print(json.dumps(runs[-1]), flush=True)
    means = {f"{t:g}": float(np.mean([r["test_accuracy"] for r in runs if r["threshold"] == t])) for t in thresholds}
    return dict(epochs=epochs, train_images=train_limit, seeds=list(seeds), runs=runs, mean_test_accuracy=means)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="resnet20_mpw_fashion_mnist")
    parser.add_argument("--images", type=int, default=512, help="Fashion-MNIST test images for the gradient study")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--train-epochs", type=int, default=0, help="0 skips the training study")
    parser.add_argument("--train", type=int, default=15000, help="training images of the training study")
    parser.add_argument("--train-thresholds", type=float, nargs="+", default=[0.1, 0.01])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "mpw_gradient_threshold.json"))
    args = parser.parse_args()
    report = dict(config=vars(args), gradient=gradient_study(args.preset, args.images, args.batch))
    if args.train_epochs:
        report["training"] = training_study(args.train_thresholds, args.train_epochs, args.train, args.seeds)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
