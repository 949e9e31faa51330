"""Fashion-MNIST zero-shot retrieval: GSP vs global average pooling (Gurbuz 2022, ch. 5).

Train on classes 0-4 (a subsample of the training split), evaluate retrieval on the test images of the unseen
classes 5-9. Every variant uses the same backbone (``zoo.small_convnet`` + a 1x1 conv to 128-d local embeddings, as
in the thesis' Sec. 5.2.4), the same loss (ProxyNCA++, temperature 0.1, proxies as ``ClassProxies`` weights), the
same class-balanced batches, seed and number of steps; only the pooling differs:

- ``gap``: global average pooling;
- ``gsp``: ``GeneralizedSumPooling`` (64 prototypes, mu = 0.3, epsilon = 2.0 (gamma = 0.5) for a proxy loss, at
  most 100 iterations),
  one GAP warm-up epoch then greedy k-center prototypes (``GSPPrototypeInit``);
- ``gsp_zs``: ``gsp`` plus the zero-shot loss, ``0.9 L_DML + 0.1 L_ZS`` (Eq. 5.2.5).

Embeddings are L2-normalized (cosine retrieval). Reports MAP@R, P@1, R@k and NMI per run and their mean. The
``gap`` and ``gsp`` networks are ``zoo.embedding_model`` (pooling ``"gap"``/``"gsp"``, ``embedding_dim=None``, on the
local-embedding backbone, unnormalized images: ``zoo_inputs.RAW_PIXELS``) + ``ClassProxies``.

    python experiments/gsp_fashion_mnist.py [--seeds 0 1 --variants gap gsp gsp_zs --epochs 4]
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

import zoo  # noqa: E402
from ot_layers import ClassProxies, GeneralizedSumPooling  # noqa: E402
from ot_layers.callbacks import GSPPrototypeInit  # noqa: E402
from ot_layers.losses import ZERO_SHOT_WEIGHT, ProxyNCAPlusPlusLoss, ZeroShotPredictionLoss  # noqa: E402
from training.data.fashion_mnist import load_fashion_mnist
from training.data.splits import select_classes
from training.evaluation.retrieval import retrieval_metrics
from training.data.samplers import ClassBalancedBatches
from zoo_inputs import RAW_PIXELS  # noqa: E402
from otzoo.arguments import positive_int

TRAIN_CLASSES, TEST_CLASSES = tuple(range(5)), tuple(range(5, 10))
EMBEDDING_DIM = 128
GSP = dict(num_prototypes=64, transport_ratio=0.3, epsilon=2.0, max_iter=100)


def first_per_class(images, labels, count):
    """The first ``count`` images of each class (labels ``0..C-1``), class by class."""
    keep = np.concatenate([np.flatnonzero(labels == c)[:count] for c in range(int(labels.max()) + 1)])
    return images[keep], labels[keep]


def local_embedding_backbone(input_shape=(28, 28, 1)):
    """small_convnet + the 1x1 convolution to 128-d local embeddings: the feature map every variant pools."""
    backbone = zoo.small_convnet(input_shape, width=32, feature_dim=64)
    local = keras.layers.Conv2D(EMBEDDING_DIM, 1, name="local_embedding")(backbone.output)
    return keras.Model(backbone.input, local, name="local_embedding_backbone")


def build(variant, num_classes, gsp=GSP, input_shape=(28, 28, 1)):
    """``(training model, embedding model, zero_shot)``: ``zoo.embedding_model`` on the local embeddings (the
    pooling's output itself, no Dense after it) followed by ``ClassProxies`` (layer ``proxies``, as
    ``zoo.proxy_training_model`` adds them; their similarities are what ProxyNCA++ reads); for ``gsp_zs`` also the
    class embeddings of GSP's pseudo-attributes. ``gsp``: the ``GeneralizedSumPooling`` options; ``input_shape``:
    the images' (28x28 Fashion-MNIST, or larger cluttered canvases).

    The proxies are created before the pooling layer: Keras draws an initializer's seed when the layer is created,
    so this order keeps the initial weights of the published runs."""
    backbone = local_embedding_backbone(input_shape)
    proxies = ClassProxies(num_classes, name="proxies")
    if variant != "gsp_zs":
        pooling_kwargs = gsp if variant == "gsp" else None
        embedding_model = zoo.embedding_model(backbone, variant, None, pooling_kwargs=pooling_kwargs, **RAW_PIXELS)
        return keras.Model(embedding_model.input, proxies(embedding_model.output)), embedding_model, False
    # zoo.embedding_model keeps only the pooled vectors: the zero-shot variant, which also needs the
    # pseudo-attributes, calls the same layers itself (no L2 normalization: the proxies and the cosine retrieval
    # normalize anyway)
    pooled, z = GeneralizedSumPooling(**gsp, return_attributes=True, name="gsp")(backbone.output)
    class_embeddings = ClassProxies(num_classes, dim=64, output="packed", name="class_embeddings")
    return (keras.Model(backbone.input, [proxies(pooled), class_embeddings(z)]), keras.Model(backbone.input, pooled),
            True)


def run(variant, seed, data, args):
    (x_train, y_train), (x_test, y_test) = data
    keras.utils.set_random_seed(seed)
    model, embedding_model, zero_shot = build(variant, len(TRAIN_CLASSES))
    dml = ProxyNCAPlusPlusLoss(temperature=0.1)
    if not zero_shot:
        loss, loss_weights = dml, None
    else:
        loss = [dml, ZeroShotPredictionLoss()]
        loss_weights = [1 - ZERO_SHOT_WEIGHT, ZERO_SHOT_WEIGHT]
    model.compile(optimizer=keras.optimizers.Adam(args.learning_rate), loss=loss, loss_weights=loss_weights,
                  jit_compile=False)
    batches = ClassBalancedBatches(x_train, y_train, classes_per_batch=len(TRAIN_CLASSES),
                                   samples_per_class=args.samples_per_class,
                                   steps_per_epoch=len(x_train) // (len(TRAIN_CLASSES) * args.samples_per_class),
                                   seed=seed)
    if zero_shot:
        batches = _TwoTargets(batches)
    callbacks = []
    if variant != "gap":
        callbacks.append(GSPPrototypeInit(x_train[:256], layer_name="gsp", warmup_epochs=1, num_features=1024,
                                          seed=seed))
    start = time.perf_counter()
    history = model.fit(batches, epochs=args.epochs, verbose=0, callbacks=callbacks)
    train_seconds = time.perf_counter() - start
    embeddings = embedding_model.predict(x_test, batch_size=500, verbose=0)
    metrics = retrieval_metrics(embeddings, y_test, metric="cosine", seed=seed)
    return {"variant": variant, "seed": seed, "train_seconds": train_seconds,
            "final_loss": float(history.history["loss"][-1]), **metrics}


class _TwoTargets(keras.utils.PyDataset):
    """The same batches with the labels given to both model outputs (embedding and pseudo-attributes)."""

    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        x, y = self.batches[index]
        return x, (y, y)

    def on_epoch_begin(self):
        self.batches.on_epoch_begin()

    def on_epoch_end(self):
        self.batches.on_epoch_end()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", default=["gap", "gsp", "gsp_zs"], choices=["gap", "gsp", "gsp_zs"])
    parser.add_argument("--train-per-class", type=int, default=1000)
    parser.add_argument("--epochs", type=positive_int, default=4)
    parser.add_argument("--samples-per-class", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--output",
                        default=os.path.join(os.path.dirname(__file__), "results", "gsp_fashion_mnist.json"))
    args = parser.parse_args()

    x, y = load_fashion_mnist("train")
    x_train, y_train = first_per_class(*select_classes(x, y, TRAIN_CLASSES), args.train_per_class)
    x, y = load_fashion_mnist("test")
    x_test, y_test = select_classes(x, y, TEST_CLASSES)
    data = ((x_train, y_train), (x_test, y_test))
    print(f"train {len(x_train)} images of classes {TRAIN_CLASSES}, test {len(x_test)} of {TEST_CLASSES}", flush=True)

    runs = []
    for seed in args.seeds:
        for variant in args.variants:
            runs.append(run(variant, seed, data, args))
            r = runs[-1]
            print(f"seed {seed} {variant:6s}: MAP@R {r['map_at_r']:.4f} P@1 {r['precision_at_1']:.4f} "
                  f"R@8 {r['recall_at_8']:.4f} NMI {r['nmi']:.4f} ({r['train_seconds']:.0f}s train)", flush=True)
    keys = ("map_at_r", "precision_at_1", "recall_at_1", "recall_at_2", "recall_at_4", "recall_at_8", "nmi")
    mean = {v: {k: float(np.mean([r[k] for r in runs if r["variant"] == v])) for k in keys} for v in args.variants}
    for v in args.variants:
        print(f"mean {v:6s}: MAP@R {mean[v]['map_at_r']:.4f} P@1 {mean[v]['precision_at_1']:.4f}")
    with open(args.output, "w") as handle:
        json.dump({"config": vars(args), "runs": runs, "mean": mean}, handle, indent=2)


if __name__ == "__main__":
    main()
