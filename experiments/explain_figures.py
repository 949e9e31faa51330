"""Every picture of docs/explain.md, from the pretrained presets where they exist, else from quickly trained models.

For each kind the script uses the preset named below when ``zoo.model_card(name)["metrics"]`` is not None (its
weights are trained) and otherwise trains a small stand-in on Fashion-MNIST for a few hundred steps on the CPU; it
prints which it used for each picture and writes the same list to ``docs/images/explain_sources.txt``. Re-run it
once the presets are trained to replace the stand-ins:

    PYTHONPATH=. python experiments/explain_figures.py --out docs/images

Stand-ins (``zoo.small_convnet``, width 16, 32-channel 7x7 feature map, BatchNorm momentum 0.9, Adam 1e-3, seed 0):

- GSP: ``zoo.embedding_model(pooling="gsp")`` (4 prototypes, transport ratio 0.3, epsilon 0.2) + ``ClassProxies``
  trained with ProxyNCA++ on classes 0-4 (one GAP warm-up epoch, then ``GSPPrototypeInit``'s k-center prototypes);
- EMD: a GAP + Dense classifier pre-trained on classes 0-4, its backbone then shared by
  ``zoo.few_shot_model(head="emd")`` (DeepEMD's pre-training stage without meta-training), shown on an episode of
  the unseen classes 5-9;
- prototypes: ``zoo.image_classifier(head="hyperspherical", dim=8)`` trained with ``HypersphericalPullLoss``,
  ``PrototypeReassignment`` every 20 batches and every epoch, and ``explain.AssignmentHistory``.
"""
import argparse
import os
import time

import keras
import numpy as np

import explain
import zoo
from explain.signals import FASHION_MNIST_CLASSES
from ot_layers.callbacks import GSPPrototypeInit, PrototypeReassignment
from ot_layers.losses import HypersphericalPullLoss, ProxyNCAPlusPlusLoss
from training.data.fashion_mnist import load_fashion_mnist
from training.data.splits import select_classes
from zoo.loading import preset_dir

MPW = "resnet20_mpw_fashion_mnist"
GAP = "resnet20_gap_fashion_mnist"
GSP = "resnet20_gsp_retrieval_fashion_mnist"
RETRIEVAL = ("resnet20_gsp_retrieval_fashion_mnist", "resnet20_gap_retrieval_fashion_mnist")
EMD = "resnet20_emd_fewshot_fashion_mnist"
HYPERSPHERICAL = "resnet20_hyperspherical_fashion_mnist"
BASE, NOVEL = list(range(5)), list(range(5, 10))
SMALL = dict(width=16, feature_dim=32, bn_momentum=0.9)


def trained(name):
    """Whether ``name`` is a registered preset with trained weights."""
    try:
        return zoo.model_card(name)["metrics"] is not None
    except ValueError:  # not in this registry
        return False


def first_of_each(labels, classes, skip=0):
    """The test index of the ``skip``-th image of each class in ``classes``."""
    return [int(np.flatnonzero(labels == c)[skip]) for c in classes]


def quick_gsp(x, y, steps, seed, epsilon=0.2, prototypes=4):
    keras.utils.set_random_seed(seed)
    x, y = select_classes(x, y, BASE)
    model = zoo.embedding_model("small_convnet", "gsp", 64, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                                pooling_kwargs=dict(num_prototypes=prototypes, transport_ratio=0.3, epsilon=epsilon,
                                                    max_iter=100))
    train = zoo.proxy_training_model(model, len(BASE))
    train.compile(keras.optimizers.Adam(1e-3), ProxyNCAPlusPlusLoss())
    per_epoch = steps // 2
    init = GSPPrototypeInit(x[:512], layer_name="gsp", warmup_epochs=1, num_features=1024, seed=seed)
    train.fit(x[:per_epoch * 64], y[:per_epoch * 64], batch_size=64, epochs=2, callbacks=[init], verbose=0)
    return model


def quick_emd(x, y, steps, seed):
    keras.utils.set_random_seed(seed)
    x, y = select_classes(x, y, BASE)
    backbone = zoo.small_convnet((28, 28, 1), **SMALL)
    classifier = zoo.image_classifier(backbone, "gap_fc", len(BASE), input_shape=(28, 28, 1))
    classifier.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    classifier.fit(x[:steps * 64], y[:steps * 64], batch_size=64, epochs=1, verbose=0)
    return zoo.few_shot_model(backbone, "emd", ways=len(NOVEL), input_shape=(28, 28, 1))


def quick_hyperspherical(x, y, steps, seed):
    keras.utils.set_random_seed(seed)
    model = zoo.image_classifier("small_convnet", "hyperspherical", 10, input_shape=(28, 28, 1),
                                 backbone_kwargs=SMALL, head_kwargs=dict(dim=8))
    train = zoo.hyperspherical_training_model(model)
    train.compile(keras.optimizers.Adam(1e-3), HypersphericalPullLoss())
    history = explain.AssignmentHistory()
    epochs = 4
    per_epoch = steps // epochs
    train.fit([x[:per_epoch * 64], y[:per_epoch * 64]], y[:per_epoch * 64], batch_size=64, epochs=epochs, verbose=0,
              callbacks=[PrototypeReassignment(batch_frequency=20), history])
    return model, history.assignments


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.path.join("docs", "images"))
    parser.add_argument("--steps", type=int, default=300, help="training steps of each stand-in model")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    x_train, y_train = load_fashion_mnist("train", normalize=False)
    x_test, y_test = load_fashion_mnist("test", normalize=False)
    sources = []

    def done(kind, path, source, start):
        line = f"{os.path.basename(path)}: {source} ({time.time() - start:.0f} s)"
        print(line, flush=True)
        sources.append(line)

    # 1. MPW plans: a correctly and a wrongly classified test image.
    start = time.time()
    model = zoo.load(MPW)
    predictions = np.argmax(model.predict(x_test[:500], verbose=0), axis=1)
    right = int(np.flatnonzero(predictions == y_test[:500])[0])
    wrong = int(np.flatnonzero(predictions != y_test[:500])[0])
    for tag, index in (("right", right), ("wrong", wrong)):
        path = explain.plot_mpw_plans(model, x_test[index], os.path.join(args.out, f"explain_mpw_{tag}.png"),
                                      label=y_test[index], class_names=FASHION_MNIST_CLASSES)
        done("mpw", path, f"preset {MPW}, test image {index}", start)

    # 2. Retrieval panel: a retrieval preset on its unseen classes, else the classifier's pooled backbone features.
    start = time.time()
    name = next((n for n in RETRIEVAL if trained(n)), None)
    if name is None:
        retrieval_model, pool, name = zoo.load(GAP), list(range(10)), GAP
        what = f"preset {GAP} (no retrieval preset trained yet: its pooled backbone features)"
    else:
        retrieval_model, pool, what = zoo.load(name), NOVEL, f"preset {name}, unseen classes 5-9"
    gallery = np.flatnonzero(np.isin(y_test, pool))[:1000]
    # the first gallery image of four classes, among them the easily confused pullover, coat and shirt
    classes = [c for c in (9, 2, 4, 6, 5, 7, 8) if c in pool][:4]
    queries = [int(gallery[np.flatnonzero(y_test[gallery] == c)[0]]) for c in classes]
    position = {int(g): i for i, g in enumerate(gallery)}
    path = explain.plot_retrieval(retrieval_model, x_test[queries], x_test[gallery],
                                  os.path.join(args.out, "explain_retrieval.png"), query_labels=y_test[queries],
                                  gallery_labels=y_test[gallery], k=6, exclude=[position[q] for q in queries],
                                  class_names=FASHION_MNIST_CLASSES)
    done("retrieval", path, what, start)

    # 3. Training curves of every trained preset that ships a log.
    start = time.time()
    logs = {n: os.path.join(preset_dir(n), "train_log.csv") for n in zoo.list_models()
            if trained(n) and os.path.isfile(os.path.join(preset_dir(n), "train_log.csv"))}
    classification = {n: p for n, p in logs.items() if zoo.model_card(n)["task"] == "classification"}
    path = explain.plot_training_curves(classification, os.path.join(args.out, "explain_curves.png"))
    done("curves", path, "train_log.csv of " + ", ".join(classification), start)

    # 4. GSP pooling weights on seen (0-4) and unseen (5-9) classes.
    start = time.time()
    if trained(GSP):
        gsp_model, what = zoo.load(GSP), f"preset {GSP}"
    else:
        gsp_model = quick_gsp(x_train, y_train, args.steps, args.seed)
        what = f"stand-in: small_convnet GSP embedding, ProxyNCA++ on classes 0-4, {args.steps} steps"
    images = first_of_each(y_test, [0, 1, 3, 5, 7, 8])
    path = explain.plot_gsp_weights(gsp_model, x_test[images], os.path.join(args.out, "explain_gsp.png"),
                                    labels=y_test[images], class_names=FASHION_MNIST_CLASSES)
    done("gsp", path, what, start)

    # 5. EMD flows in a 5-way 1-shot episode of the unseen classes: the query's own class and another one.
    start = time.time()
    if trained(EMD):
        emd_model, what = zoo.load(EMD), f"preset {EMD}"
    else:
        emd_model = quick_emd(x_train, y_train, args.steps, args.seed)
        what = f"stand-in: small_convnet pre-trained on classes 0-4 ({args.steps} steps), EMD head (sinkhorn)"
    support = first_of_each(y_test, NOVEL, skip=1)
    query = first_of_each(y_test, [7])[0]  # a sneaker
    names = [FASHION_MNIST_CLASSES[c] for c in NOVEL]
    support_labels = np.arange(len(NOVEL))
    label = NOVEL.index(7)
    logits = explain.emd_flows(emd_model, x_test[query], x_test[support], support_labels).logits[0]
    other = int(next(c for c in np.argsort(-logits) if c != label))
    for tag, cls in (("same", label), ("other", other)):
        path = explain.plot_emd_flows(emd_model, x_test[query], x_test[support], support_labels,
                                      os.path.join(args.out, f"explain_emd_{tag}.png"), class_index=cls,
                                      query_label=label, class_names=names)
        done("emd", path, f"{what}; query test image {query}, support test images {support}", start)

    # 6. Hyperspherical prototypes and the assignment over epochs.
    start = time.time()
    if trained(HYPERSPHERICAL):
        proto_model, what = zoo.load(HYPERSPHERICAL), f"preset {HYPERSPHERICAL}"
        log = os.path.join(preset_dir(HYPERSPHERICAL), "train_log.csv")
        history = log if os.path.isfile(log) and "prototype_changes" in open(log).readline() else None
    else:
        proto_model, history = quick_hyperspherical(x_train, y_train, args.steps, args.seed)
        what = f"stand-in: small_convnet + GAP + Dense(8) hyperspherical head, {args.steps} steps over 4 epochs"
    path = explain.plot_prototypes(proto_model, os.path.join(args.out, "explain_prototypes.png"), history=history,
                                   class_names=FASHION_MNIST_CLASSES)
    done("prototypes", path, what, start)

    with open(os.path.join(args.out, "explain_sources.txt"), "w") as handle:
        handle.write("Made by `PYTHONPATH=. python experiments/explain_figures.py`:\n" + "\n".join(sources) + "\n")


if __name__ == "__main__":
    main()
