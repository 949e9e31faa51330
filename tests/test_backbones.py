"""zoo.backbones.backbone: every named backbone for any input size and channel count, user and keras.applications
models, and the errors. Shapes and parameter counts are checked against closed forms of the architectures."""
import math
import re

import keras
import numpy as np
import pytest

from zoo.backbones import BACKBONES, backbone, resnet12_pooling
from zoo.inputs import check_input_shape

SHAPES = [(28, 28, 1), (32, 32, 3), (84, 84, 3), (None, None, 3)]
CHANNELS = {"resnet20": 64, "resnet32": 64, "resnet56": 64, "resnet12": 640, "small_convnet": 64}


def expected_spatial(name, size):
    """The output side for an input side ``size`` (None stays None), from the architectures' strides."""
    if size is None:
        return None
    if name.startswith("resnet") and name != "resnet12":  # 'same' convolutions, two stride-2 stages
        return math.ceil(math.ceil(size / 2) / 2)
    if name == "small_convnet":  # two 2x2 'valid' max poolings
        return size // 2 // 2
    # resnet12: halve (floor) while the map stays >= 5 pixels, at most four times
    for _ in range(4):
        if size // 2 < 5:
            break
        size //= 2
    return size


def cifar_resnet_params(depth, channels, widths=(16, 32, 64)):
    """Closed-form parameter count: 3x3 convolutions without bias, BatchNorm (4 per channel), 1x1 projection
    shortcuts (with BatchNorm) where a block changes the width."""
    n = (depth - 2) // 6
    total = 9 * channels * widths[0] + 4 * widths[0]
    cin = widths[0]
    for width in widths:
        for _ in range(n):
            total += 9 * cin * width + 9 * width * width + 2 * 4 * width
            if cin != width:
                total += cin * width + 4 * width
            cin = width
    return total


def resnet12_params(channels, widths=(64, 160, 320, 640)):
    total, cin = 0, channels
    for width in widths:
        total += cin * width + 4 * width  # 1x1 shortcut + BN
        total += 9 * cin * width + 2 * 9 * width * width + 3 * 4 * width  # three 3x3 conv-BN
        cin = width
    return total


@pytest.mark.parametrize("name", BACKBONES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(str(d) for d in s))
def test_named_backbone_output_shape(name, shape):
    model = backbone(name, shape)
    assert isinstance(model, keras.Model)
    assert model.input_shape == (None,) + shape
    expected = (None, expected_spatial(name, shape[0]), expected_spatial(name, shape[1]), CHANNELS[name])
    assert model.output_shape == expected


@pytest.mark.parametrize("name", BACKBONES)
def test_named_backbone_runs_on_open_sizes(name):
    """A model built with (None, None, 3) runs on any image size; the run's shape follows the closed form."""
    model = backbone(name, (None, None, 3))
    images = np.random.default_rng(0).uniform(0, 1, (2, 20, 28, 3)).astype("float32")
    features = np.asarray(model(images, training=False))
    # an open input size downsamples in all four ResNet-12 blocks
    spatial = (lambda s: s // 16) if name == "resnet12" else (lambda s: expected_spatial(name, s))
    assert features.shape == (2, spatial(20), spatial(28), CHANNELS[name])
    assert np.all(np.isfinite(features))


def test_parameter_counts_match_closed_forms():
    for depth, channels in ((20, 1), (32, 3), (56, 1)):
        model = backbone(f"resnet{depth}", (28, 28, channels))
        assert model.count_params() == cifar_resnet_params(depth, channels)
    # He et al. (2016), Table 6: ResNet-20 has 0.27 M parameters (option A shortcuts; ours are 1x1 projections)
    resnet20 = backbone("resnet20")
    assert resnet20.count_params() == cifar_resnet_params(20, 3)
    assert abs(resnet20.count_params() - 0.27e6) / 0.27e6 < 0.02
    for shape in ((28, 28, 1), (84, 84, 3)):  # the pooling choice leaves the weights unchanged
        assert backbone("resnet12", shape).count_params() == resnet12_params(shape[2])


def test_resnet12_pooling_rule():
    assert resnet12_pooling((84, 84, 3)) == (True, True, True, True)  # 5x5, the DeepEMD map
    assert resnet12_pooling((28, 28, 1)) == (True, True, False, False)  # 7x7
    assert resnet12_pooling((32, 32, 3)) == (True, True, False, False)  # 8x8
    assert resnet12_pooling((None, None, 3)) == (True, True, True, True)
    explicit = backbone("resnet12", (28, 28, 1), pool=(True, False, False, False), widths=(8, 8, 8, 8))
    assert explicit.output_shape == (None, 14, 14, 8)


def test_resnet12_names_an_input_its_pooling_cannot_take():
    """``zoo.resnet12`` took a rank-2 ``input_shape`` and more poolings than the input's side allows, and failed in
    Keras' words (``min_ndim=4``; MaxPooling2D on an empty map)."""
    import zoo

    with pytest.raises(ValueError, match=r"^`pool` downsamples 4 times, more than the 8-pixel side of `input_shape` "
                                         r"\(8, 8, 3\) allows \(3 at most\)"):
        backbone("resnet12", (8, 8, 3), pool=(True,) * 4, widths=(8, 8, 8, 8))
    assert backbone("resnet12", (8, 8, 3), pool=(True, True, True, False), widths=(8, 8, 8, 8)).output_shape == (
        None, 1, 1, 8)
    with pytest.raises(ValueError, match=r"^`input_shape` must be \(height, width, channels\)"):
        zoo.resnet12(input_shape=(28, 28))


def _small_image_error(size, limit=16, halvings=4):
    return re.escape(f"ResNet-12 downsamples {halvings} times and takes images of at least {limit}x{limit} pixels, "
                     f"got {size}; upsample the images, or build it for their size (zoo.backbone('resnet12', "
                     "(height, width, channels)) pools less).")


def test_open_size_resnet12_names_images_its_pooling_cannot_take(tmp_path):
    """Built for an open size, ResNet-12 pools in all four blocks: images under 16 pixels a side gave an empty
    feature map without a word (TensorFlow eagerly, JAX) or an error of the fourth pooling about a negative size
    (TensorFlow's predict, PyTorch). The first pooling checks them, saved and reloaded too; a fixed size, checked
    when built, keeps Keras' own layers."""
    import zoo

    model = backbone("resnet12", (None, None, 3), widths=(4, 4, 4, 4))
    assert model(np.zeros((1, 16, 20, 3), np.float32)).shape == (1, 1, 1, 4)
    for shape, size in (((1, 8, 8, 3), "8x8"), ((2, 15, 40, 3), "15x40")):
        with pytest.raises(ValueError, match=_small_image_error(size)):
            model(np.zeros(shape, np.float32))
    with pytest.raises(ValueError, match=_small_image_error("8x8")):  # a model built on it: as it is built
        model(keras.Input((8, 8, 3)))
    with pytest.raises(ValueError, match=_small_image_error("8x8")):
        zoo.embedding_model(model, input_shape=(8, 8, 3))

    from zoo.resnet12 import MinSizeMaxPooling2D

    one_open = zoo.resnet12((None, 28, 1), widths=(4, 4, 4, 4), pool=(False, True, True, False))
    assert [type(layer) for layer in one_open.layers if layer.name.endswith("_pool")] == [
        MinSizeMaxPooling2D, keras.layers.MaxPooling2D]  # the first pooling's input is the image's size
    with pytest.raises(ValueError, match=_small_image_error("3x28", limit=4, halvings=2)):
        one_open(np.zeros((1, 3, 28, 1), np.float32))

    reloaded = keras.models.model_from_json(model.to_json())
    with pytest.raises(ValueError, match=_small_image_error("8x8")):
        reloaded(np.zeros((1, 8, 8, 3), np.float32))
    model.save(str(tmp_path / "resnet12.keras"))
    with pytest.raises(ValueError, match=_small_image_error("8x8")):
        keras.saving.load_model(str(tmp_path / "resnet12.keras"))(np.zeros((1, 8, 8, 3), np.float32))

    fixed = backbone("resnet12", (84, 84, 3), widths=(4, 4, 4, 4))
    assert {type(layer) for layer in fixed.layers if layer.name.endswith("_pool")} == {keras.layers.MaxPooling2D}
    assert not any(type(layer) is MinSizeMaxPooling2D
                   for layer in backbone("resnet12", (None, None, 3), pool=(False,) * 4, widths=(4,) * 4).layers)

    # Last: Keras' JAX predict leaves a model it failed in without its variables (it restores them only at the end)
    with pytest.raises(ValueError, match=_small_image_error("12x12")):
        model.predict(np.zeros((2, 12, 12, 3), np.float32), verbose=0)


def test_builder_options_pass_through():
    model = backbone("small_convnet", (32, 32, 3), width=8, feature_dim=16, name="tiny")
    assert model.name == "tiny" and model.output_shape == (None, 8, 8, 16)
    assert backbone("ResNet20", (28, 28, 1)).name == "resnet20"  # names are case-insensitive


def test_user_model_is_returned_as_is():
    inputs = keras.Input((16, 16, 2))
    x = keras.layers.Conv2D(5, 3, strides=2, padding="same")(inputs)
    user = keras.Model(inputs, x, name="user_net")
    assert backbone(user) is user
    assert backbone(user, (16, 16, 2)) is user


def test_keras_applications_model_without_top():
    mobilenet = keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=(32, 32, 3))
    assert backbone(mobilenet, (32, 32, 3)) is mobilenet
    assert mobilenet.output_shape == (None, 1, 1, 1280)
    features = np.asarray(mobilenet(np.zeros((1, 32, 32, 3), "float32"), training=False))
    assert features.shape == (1, 1, 1, 1280)


def test_subclassed_user_model_needs_input_shape():
    class Net(keras.Model):
        def __init__(self):
            super().__init__(name="sub_net")
            self.conv = keras.layers.Conv2D(4, 3, padding="same")

        def call(self, x):
            return self.conv(x)

        def compute_output_shape(self, input_shape):
            return tuple(input_shape[:-1]) + (4,)

    net = Net()
    assert backbone(net, (8, 8, 3)) is net
    with pytest.raises(ValueError, match="`backbone` 'sub_net' is not built: pass `input_shape`"):
        backbone(Net())


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="`backbone` must be one of") as info:
        backbone("resnet18", (32, 32, 3))
    for name in BACKBONES:
        assert repr(name) in str(info.value)
    with pytest.raises(ValueError, match="`backbone` must be one of .* got an object of type int"):
        backbone(3)


def test_models_without_a_feature_map_are_refused():
    pooled = keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=(32, 32, 3),
                                            pooling="avg")
    with pytest.raises(ValueError, match=r"`backbone` must output a feature map .* include_top=False, pooling=None"):
        backbone(pooled)
    inputs = keras.Input((8, 8, 3))
    classifier = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(inputs)), name="clf")
    with pytest.raises(ValueError, match=r"`backbone` must output a feature map \(B, H, W, C\); 'clf' outputs"):
        backbone(classifier)
    x = keras.layers.Conv2D(2, 1)(inputs)
    two_outputs = keras.Model(inputs, [x, x], name="two")
    with pytest.raises(ValueError, match="`backbone` must have a single output"):
        backbone(two_outputs)


def test_model_options_and_shape_mismatch_are_refused():
    inputs = keras.Input((16, 16, 3))
    user = keras.Model(inputs, keras.layers.Conv2D(4, 3)(inputs), name="user_net")
    with pytest.raises(ValueError, match="apply to named backbones only"):
        backbone(user, width=8)
    with pytest.raises(ValueError, match=r"`input_shape` \(16, 16, 1\) does not fit the input"):
        backbone(user, (16, 16, 1))


@pytest.mark.parametrize("shape", [(28, 28), (28, 28, None), (0, 28, 1), (28.5, 28, 1), "abc", 5, (28, True, 1)])
def test_bad_input_shape(shape):
    with pytest.raises(ValueError, match="`input_shape` must be"):
        backbone("resnet20", shape)
    with pytest.raises(ValueError, match="`input_shape` must be"):
        check_input_shape(shape)


def test_too_small_input_for_small_convnet():
    with pytest.raises(ValueError, match="`input_shape` of small_convnet needs height and width >= 4"):
        backbone("small_convnet", (3, 3, 1))
