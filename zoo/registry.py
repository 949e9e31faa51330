"""The presets registry: what each zoo model is (architecture, data, recipe), by name.

A preset's pretrained files live in ``zoo/presets/<name>/``: ``model.weights.h5`` and ``metadata.json`` (the model
card). ``zoo.build(name)`` makes the architecture from the entry below; ``zoo.load(name)`` adds the weights.
"""
FASHION_MNIST = dict(dataset="fashion_mnist", input_shape=(28, 28, 1), num_classes=10,
                     pixel_mean=0.2860406, pixel_std=0.3530242)  # the 60k training images' statistics

# The classification recipe both ResNet-20 heads share (same budget, data order and augmentation).
RESNET20_CLASSIFICATION_RECIPE = dict(epochs=10, batch_size=128, optimizer="sgd", learning_rate=0.1, momentum=0.9,
                                      nesterov=True, schedule="cosine", l2=5e-4, augment="pad_crop_flip", pad=2,
                                      seed=0, jit_compile=True)

PRESETS = {
    "resnet20_gap_fashion_mnist": dict(
        task="classification", backbone="resnet20", head="gap_fc", head_kwargs={}, **FASHION_MNIST,
        split="train (60,000) / test (10,000)", recipe=RESNET20_CLASSIFICATION_RECIPE,
        description="CIFAR-style ResNet-20 + global average pooling + Dense on Fashion-MNIST.",
    ),
    "resnet20_mpw_fashion_mnist": dict(
        task="classification", backbone="resnet20", head="mpw",
        head_kwargs=dict(num_proxies=4, epsilon=0.1), **FASHION_MNIST,
        split="train (60,000) / test (10,000)", recipe=RESNET20_CLASSIFICATION_RECIPE,
        description="CIFAR-style ResNet-20 + Multi-Proxy Wasserstein head (4 proxies per class, Sinkhorn "
                    "epsilon 0.1) on the 7x7x64 feature map, on Fashion-MNIST.",
    ),
}
