"""The presets registry: what each zoo model is (architecture, data, recipe), by name.

``PRESETS`` maps a preset's name to its :class:`zoo.spec.PresetSpec` (frozen dataclasses: the architecture, the data
set, the recipe a model card publishes, the description). A preset's pretrained files live in
``zoo/presets/<name>/``: ``model.weights.h5`` and ``metadata.json`` (the model card). ``zoo.build(name)`` makes the
architecture from the entry below; ``zoo.load(name)`` adds the weights.
"""
from zoo.spec import Architecture, DataSpec, FewShotRecipe, PresetSpec, Recipe

# The 60k training images' statistics.
FASHION_MNIST = dict(dataset="fashion_mnist", input_shape=(28, 28, 1), num_classes=10, pixel_mean=0.2860406,
                     pixel_std=0.3530242)
FULL_SPLIT = DataSpec(**FASHION_MNIST, split="train (60,000) / test (10,000)")
# Retrieval (Gurbuz 2022, ch. 5 protocol): train on classes 0-4 of the training split, evaluate on the test images
# of 5-9.
RETRIEVAL_SPLIT = DataSpec(**FASHION_MNIST,
                           split="train images of classes 0-4 (30,000) / test images of classes 5-9 (5,000)",
                           train_classes=(0, 1, 2, 3, 4), eval_classes=(5, 6, 7, 8, 9))
FEW_SHOT_SPLIT = DataSpec(**FASHION_MNIST,
                          split="base: train images of classes 0-4 (30,000) / novel: test images of classes 5-9 "
                                "(5,000)",
                          train_classes=(0, 1, 2, 3, 4), eval_classes=(5, 6, 7, 8, 9))

# The classification recipe the ResNet-20 heads share (same budget, data order and augmentation): SGD with Nesterov
# momentum, cosine decay, pad-crop-flip (He et al. 2016), cross-entropy.
RESNET20_CLASSIFICATION_RECIPE = Recipe(epochs=10, batch_size=128, optimizer="sgd", learning_rate=0.1, momentum=0.9,
                                        nesterov=True, schedule="cosine", l2=5e-4, augment="pad_crop_flip", pad=2,
                                        loss="cross_entropy", seed=0, jit_compile=True)

# DL2PA (Saadabadi et al. 2024): the classification recipe and budget, the hyperspherical pull loss and per-epoch
# Hungarian re-assignment of the prototypes.
HYPERSPHERICAL_RECIPE = Recipe(epochs=10, batch_size=128, optimizer="sgd", learning_rate=0.1, momentum=0.9,
                               nesterov=True, schedule="cosine", l2=5e-4, augment="pad_crop_flip", pad=2,
                               loss="hyperspherical_pull", callbacks=("PrototypeReassignment",), seed=0,
                               jit_compile=True)

# Retrieval: both poolings share the recipe: ProxyNCA++ (Teh et al. 2020; temperature 0.1, one proxy per class) on
# ClassProxies, the same optimizer, budget and data; GSP adds its prototype initialization (Gurbuz et al. 2023).
RETRIEVAL_RECIPE = Recipe(epochs=4, batch_size=128, optimizer="sgd", learning_rate=0.1, momentum=0.9, nesterov=True,
                          schedule="cosine", l2=5e-4, augment="pad_crop_flip", pad=2, loss="proxy_nca_plus_plus",
                          loss_kwargs={"temperature": 0.1, "num_proxies": 1}, seed=0, jit_compile=True)
GSP_RETRIEVAL_RECIPE = Recipe(epochs=4, batch_size=128, optimizer="sgd", learning_rate=0.1, momentum=0.9,
                              nesterov=True, schedule="cosine", l2=5e-4, augment="pad_crop_flip", pad=2,
                              loss="proxy_nca_plus_plus", loss_kwargs={"temperature": 0.1, "num_proxies": 1},
                              callbacks=("GSPPrototypeInit",), seed=0, jit_compile=True)

# Few-shot (DeepEMD, Zhang et al. 2022): pre-train backbone + GAP + Dense on the base classes (the classification
# recipe on the base images), then meta-train on 5-way 1-shot base episodes (15 queries per class) with the head.
FEW_SHOT_RECIPE = FewShotRecipe(pretrain_epochs=4, batch_size=128, optimizer="sgd", learning_rate=0.1, momentum=0.9,
                                nesterov=True, schedule="cosine", l2=5e-4, augment="pad_crop_flip", pad=2, seed=0,
                                jit_compile=True, meta_episodes=400, meta_optimizer="sgd", meta_learning_rate=0.005,
                                meta_momentum=0.9, ways=5, shots=1, queries=15, eval_shots=(1, 5),
                                eval_episodes=1000, eval_queries=15, eval_seed=0)


def _presets(*specs):
    return {spec.name: spec for spec in specs}


PRESETS = _presets(
    PresetSpec(
        "resnet20_gap_fashion_mnist", "classification", Architecture("resnet20", head="gap_fc"), FULL_SPLIT,
        RESNET20_CLASSIFICATION_RECIPE,
        description="CIFAR-style ResNet-20 + global average pooling + Dense on Fashion-MNIST.",
    ),
    PresetSpec(
        "resnet20_mpw_fashion_mnist", "classification",
        Architecture("resnet20", head="mpw", head_kwargs=dict(num_proxies=4, epsilon=0.1)), FULL_SPLIT,
        RESNET20_CLASSIFICATION_RECIPE,
        description="CIFAR-style ResNet-20 + Multi-Proxy Wasserstein head (4 proxies per class, Sinkhorn "
                    "epsilon 0.1) on the 7x7x64 feature map, on Fashion-MNIST.",
    ),
    PresetSpec(
        "resnet20_hyperspherical_fashion_mnist", "classification",
        Architecture("resnet20", head="hyperspherical", head_kwargs=dict(dim=8)), FULL_SPLIT, HYPERSPHERICAL_RECIPE,
        description="CIFAR-style ResNet-20 + GAP + Dense(8) + DL2PA hyperspherical prototypes (10 classes on the "
                    "unit sphere of dimension 8 < K - 1, Hungarian re-assignment every epoch) on Fashion-MNIST.",
    ),
    PresetSpec(
        "resnet20_gap_retrieval_fashion_mnist", "retrieval",
        Architecture("resnet20", pooling="gap", embedding_dim=128), RETRIEVAL_SPLIT, RETRIEVAL_RECIPE,
        description="CIFAR-style ResNet-20 + global average pooling + Dense(128), unit embeddings, ProxyNCA++; "
                    "trained on Fashion-MNIST classes 0-4, retrieval on the unseen classes 5-9.",
    ),
    PresetSpec(
        "resnet20_gsp_retrieval_fashion_mnist", "retrieval",
        # epsilon 0.1: the best validation MAP@R of 2.0 (Gurbuz 2022's proxy-loss value), 0.5, 0.2 and 0.1 on
        # held-out seen classes (experiments/gsp_epsilon_validation.py; classes 0-2 trained, 3-4 scored).
        Architecture("resnet20", pooling="gsp", embedding_dim=128,
                     pooling_kwargs=dict(num_prototypes=64, transport_ratio=0.3, epsilon=0.1, max_iter=100)),
        RETRIEVAL_SPLIT, GSP_RETRIEVAL_RECIPE,
        description="CIFAR-style ResNet-20 + generalized sum pooling (64 prototypes, transport ratio 0.3, epsilon "
                    "0.1 chosen on held-out seen classes) + Dense(128), unit embeddings, ProxyNCA++; trained on "
                    "Fashion-MNIST classes 0-4, retrieval on the unseen classes 5-9.",
    ),
    PresetSpec(
        "resnet20_emd_fewshot_fashion_mnist", "few_shot",
        Architecture("resnet20", head="emd", head_kwargs=dict(method="sinkhorn"), ways=5), FEW_SHOT_SPLIT,
        FEW_SHOT_RECIPE,
        description="CIFAR-style ResNet-20 + DeepEMD head (entropic EMD between 7x7 feature maps, cross-reference "
                    "weights, scale 12.5); pre-trained on Fashion-MNIST base classes 0-4, meta-trained on 5-way "
                    "1-shot episodes, evaluated on 5-way 1- and 5-shot episodes of the novel classes 5-9.",
    ),
    PresetSpec(
        "resnet20_protonet_fewshot_fashion_mnist", "few_shot",
        Architecture("resnet20", head="protonet", head_kwargs=dict(metric="cosine", scale=12.5), ways=5),
        FEW_SHOT_SPLIT, FEW_SHOT_RECIPE,
        description="The EMD preset's ProtoNet baseline: the same backbone, pre-training, meta-training budget and "
                    "episodes, with cosine-to-class-mean logits on globally average-pooled features (scale 12.5).",
    ),
)
