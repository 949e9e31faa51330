"""How close to convergence is the DeepEMD head's Sinkhorn at its defaults on real feature maps, and what does the
rest do to its logits and gradients?

``EMDHead(method="sinkhorn")`` stops each transport problem at ``threshold = 1e-3`` (row-marginal error) or after
``max_iter = 100`` updates, at ``epsilon = 0.03``. Its gradient is the implicit (fixed-point) one, exact only at
the fixed point. On the novel-class test images of the ``resnet20_emd_fewshot_fashion_mnist`` preset (7x7x64
feature maps, cross-reference node weights) this script draws 5-way 1-shot and 5-shot episodes (15 queries per
class, the preset's evaluation protocol) and reports, for several ``max_iter`` (and float32 / float64):

- per problem (query x class): Sinkhorn updates used, final marginal error, converged fraction;
- per setting over all episodes: query accuracy, changed predictions and max |logit difference| against a float64
  solve run to ``threshold = 1e-9`` (the converged reference);
- the cross-entropy gradient with respect to the query and support feature maps (meta-training's gradient):
  cosine with the reference's and relative error of the whole gradient, and the worst episode's cosine.

(``mixed_float16``: the head's inputs and logits in float16; its transport problems are solved in float32.)

    python experiments/emd_sinkhorn_convergence.py --episodes 50
"""
import argparse
import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

from ot_layers import EMDHead
from ot_layers.tensor_ops import flatten_feature_map
from training.data.datasets import image_arrays
from training.data.episodes import EpisodeSampler
from training.recipes.common import preset_spec
from zoo.tasks import few_shot_parts

REFERENCE = dict(max_iter=20000, threshold=1e-9, dtype="float64")


def settings(max_iters):
    """``{name: EMDHead overrides}``: the preset's head at each ``max_iter`` in float32, its default in float64
    (the float32 rounding at the same iterate) and under ``mixed_float16`` (inputs and logits rounded to float16,
    the solve in float32), the largest ``max_iter`` at ``threshold = 1e-5`` (what the stopping
    threshold leaves), and the converged float64 reference."""
    runs = {f"max_iter={m}": dict(max_iter=m) for m in max_iters}
    runs[f"max_iter={max_iters[0]}, float64"] = dict(max_iter=max_iters[0], dtype="float64")
    runs[f"max_iter={max_iters[0]}, mixed_float16"] = dict(max_iter=max_iters[0], dtype="mixed_float16")
    runs[f"max_iter={max_iters[-1]}, threshold=1e-5"] = dict(max_iter=max_iters[-1], threshold=1e-5)
    runs["reference"] = dict(REFERENCE)
    return runs


def head_like(head, dtype="float32", **overrides):
    config = head.get_config()
    config.update(overrides, dtype=dtype)
    return EMDHead.from_config(config)


def episode_function(head, means):
    """A compiled ``(query, support, support_labels, query_labels) -> (logits, d_query, d_support, iterations,
    error, converged)`` for one head setting (``tf.function``: the reference needs thousands of updates)."""
    dtype = head.dtype_policy.compute_dtype  # float16 under mixed_float16: the head's inputs, as in such a model

    @tf.function(reduce_retracing=True)
    def run(query, support, support_labels, query_labels):
        query, support = tf.cast(query, dtype), tf.cast(support, dtype)
        with tf.GradientTape() as tape:
            tape.watch([query, support])
            classes = tf.cast(means([support, support_labels]), dtype)
            logits = head([query, classes])
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(query_labels, logits))
        d_query, d_support = tape.gradient(loss, [query, support])
        # The head's problems again, for their per-problem counts (the head's call answers logits only).
        result = head.transport(flatten_feature_map(query), flatten_feature_map(classes))[3]  # float32 or 64
        return (tf.cast(logits, "float64"), tf.cast(d_query, "float64"), tf.cast(d_support, "float64"),
                result.iterations, result.error, result.converged)

    return run


def cosine(a, b):
    a, b = a.ravel(), b.ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def agreement(runs, other):
    """How one setting's logits and gradients agree with another's over all episodes."""
    logits = np.concatenate([r["logits"] for r in runs])
    other_logits = np.concatenate([r["logits"] for r in other])
    out = dict(max_abs_logit_difference=float(np.max(np.abs(logits - other_logits))),
               changed_predictions=int(np.sum(logits.argmax(-1) != other_logits.argmax(-1))))
    for part in ("d_query", "d_support"):
        got = np.concatenate([r[part].ravel() for r in runs])
        want = np.concatenate([r[part].ravel() for r in other])
        out[f"cosine_{part}"] = cosine(got, want)
        out[f"relative_error_{part}"] = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        out[f"worst_episode_cosine_{part}"] = min(cosine(r[part], s[part]) for r, s in zip(runs, other))
    return out


def summary(runs, reference, query_labels):
    """One setting's numbers over all episodes, against the reference's (``None`` for the reference itself)."""
    iterations = np.concatenate([r["iterations"].ravel() for r in runs])
    error = np.concatenate([r["error"].ravel() for r in runs])
    converged = np.concatenate([r["converged"].ravel() for r in runs])
    logits = np.concatenate([r["logits"] for r in runs])
    labels = np.concatenate(query_labels)
    out = dict(problems=int(iterations.size), converged_fraction=float(converged.mean()),
               iterations_median=float(np.median(iterations)), iterations_p90=float(np.percentile(iterations, 90)),
               iterations_max=int(iterations.max()), marginal_error_p90=float(np.percentile(error, 90)),
               marginal_error_max=float(error.max()), accuracy=float(np.mean(logits.argmax(-1) == labels)))
    if reference is not None:
        out.update(agreement(runs, reference))
    return out


def study(preset, shots, episodes, max_iters, seed):
    import zoo

    model = zoo.load(preset)
    embed, _ = few_shot_parts(model)
    head, means = model.get_layer("emd_head"), model.get_layer("class_means")
    spec = preset_spec(preset)
    images, labels = image_arrays(spec.data.dataset, "novel", protocol="few_shot",
                                  image_size=spec.data.input_shape[0])
    features = np.concatenate([keras.ops.convert_to_numpy(embed(tf.constant(images[i:i + 256], tf.float32)))
                               for i in range(0, len(images), 256)])
    ways, queries = spec.architecture.ways, spec.recipe.eval_queries
    compared = settings(max_iters)
    defaults = f"max_iter={max_iters[0]}"
    report = dict(preset=preset, feature_map=list(features.shape[1:]), novel_images=int(len(labels)),
                  head=dict(epsilon=head.epsilon, max_iter=head.max_iter, threshold=head.threshold),
                  reference=REFERENCE, results={})
    for k in shots:
        sampler = EpisodeSampler(labels, ways, k, queries, seed)
        drawn = [sampler.episode(i) for i in range(episodes)]
        runs = {}
        for name, overrides in compared.items():
            start = time.time()
            run = episode_function(head_like(head, **overrides), means)
            runs[name] = []
            for support, support_label, query, query_label in drawn:
                out = run(tf.constant(features[query]), tf.constant(features[support]),
                          tf.constant(support_label, tf.int32), tf.constant(query_label, tf.int32))
                runs[name].append(dict(zip(("logits", "d_query", "d_support", "iterations", "error", "converged"),
                                           (np.asarray(o, np.float64) for o in out))))
            print(f"{k}-shot {name}: {time.time() - start:.1f} s", flush=True)
        query_labels = [episode[3] for episode in drawn]
        table = {name: summary(runs[name], None if name == "reference" else runs["reference"], query_labels)
                 for name in runs}
        for name, overrides in compared.items():
            if "dtype" in overrides and name != "reference":  # the same settings in another precision
                table[name]["against_float32"] = agreement(runs[name], runs[defaults])
        for name, row in table.items():
            print(f"{k}-shot {name}: {json.dumps(row)}", flush=True)
        report["results"][f"{ways}way_{k}shot"] = dict(episodes=episodes, settings=table)
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="resnet20_emd_fewshot_fashion_mnist")
    parser.add_argument("--shots", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--episodes", type=int, default=50, help="episodes per shot setting (episode seed --seed)")
    parser.add_argument("--max-iters", type=int, nargs="+", default=[100, 300, 1000],
                        help="the first is the head's default; also run in float64")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                      "emd_sinkhorn_convergence.json"))
    args = parser.parse_args()
    report = dict(config=vars(args), **study(args.preset, args.shots, args.episodes, args.max_iters, args.seed))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(report, handle, indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
