"""Models by task, head by name: classifiers, retrieval embeddings and few-shot episode models
from a backbone spec, raw 0-255 pixels in; each checked against an independent NumPy computation or the layer
applied directly to the backbone's features."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_checks import assert_export_parity, assert_mixed_precision, assert_save_load_roundtrip
from ot_layers import EMDHead
from ot_layers.tensor_ops import normalize_rows_np
from zoo.models import (CLASSIFICATION_HEADS, hyperspherical_inference_model, hyperspherical_training_model,
                        image_classifier)
from zoo.tasks import FEW_SHOT_HEADS, RETRIEVAL_POOLINGS, embedding_model, few_shot_model, proxy_training_model

TINY = dict(input_shape=(16, 16, 1), backbone_kwargs=dict(width=8, feature_dim=8))
MEAN, STD = 0.3, 0.4


def pixels(count, seed=0, shape=(16, 16, 1)):
    return np.random.default_rng(seed).integers(0, 256, (count,) + shape).astype(np.uint8)


def backbone_features(model, x, name="small_convnet"):
    """The backbone of ``model`` applied to ``x`` normalized outside the model."""
    normalized = (x.astype(np.float64) / 255.0 - MEAN) / STD
    return np.asarray(model.get_layer(name)(normalized.astype(np.float32))).astype(np.float64)


def dense_np(model, name, x):
    kernel, bias = (np.asarray(w, np.float64) for w in model.get_layer(name).get_weights())
    return x @ kernel + bias


# ---------------------------------------------------------------------------------------------- classification


@pytest.mark.parametrize("head", CLASSIFICATION_HEADS)
def test_classifier_matches_its_pipeline_from_raw_pixels(head):
    model = image_classifier("small_convnet", head, 3, MEAN, STD, head_kwargs={"dim": 4} if head ==
                             "hyperspherical" else None, **TINY)
    x = pixels(5)
    logits = model(x)
    assert logits.shape == (5, 3) and logits.dtype == tf.float32
    np.testing.assert_allclose(np.asarray(model(x.astype(np.float32))), np.asarray(logits), atol=0)  # uint8 = float
    features = backbone_features(model, x)
    if head == "gap_fc":
        assert [layer.name for layer in model.layers][-3:] == ["small_convnet", "gap", "dense_head"]
        expected = dense_np(model, "dense_head", features.mean(axis=(1, 2)))
    elif head == "mpw":
        assert model.layers[-1].name == "mpw_head"
        expected = np.asarray(model.get_layer("mpw_head")(features.astype(np.float32)))
    else:
        layer = model.get_layer("hyperspherical_head")
        assert layer.dim == 4
        z = normalize_rows_np(dense_np(model, "embedding", features.mean(axis=(1, 2))))
        prototypes = np.asarray(layer.prototypes, np.float64)[np.asarray(layer.assignment)]
        expected = z @ normalize_rows_np(prototypes).T
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-5)


def test_hyperspherical_training_model_shares_weights_and_feeds_the_labels():
    """Same logits as the served model; in training the labels update the class representatives, the normalized
    class means of the normalized features (Saadabadi et al. 2024, Sec. 3.2; representatives start at zero)."""
    model = image_classifier("small_convnet", "hyperspherical", 3, MEAN, STD, head_kwargs={"dim": 2}, **TINY)
    train = hyperspherical_training_model(model)
    assert [tuple(i.shape) for i in train.inputs] == [(None, 16, 16, 1), (None,)]
    assert {id(w) for w in train.weights} == {id(w) for w in model.weights}
    x, y = pixels(6, seed=1), np.array([0, 1, 0, 1, 0, 1], np.int32)
    np.testing.assert_allclose(np.asarray(train([x, y])), np.asarray(model(x)), atol=0)
    embed = keras.Model(model.inputs[0], model.get_layer("embedding").output)
    z = normalize_rows_np(np.asarray(embed(x, training=True), np.float64))
    train([x, y], training=True)
    representatives = np.asarray(model.get_layer("hyperspherical_head").representatives)
    expected = normalize_rows_np(np.stack([z[y == 0].mean(0), z[y == 1].mean(0)]))
    np.testing.assert_allclose(representatives[:2], expected, atol=1e-5)
    np.testing.assert_array_equal(representatives[2], 0.0)  # class 2 absent from the batch


def test_hyperspherical_inference_model_from_a_loaded_training_model(tmp_path):
    train = hyperspherical_training_model(image_classifier("small_convnet", "hyperspherical", 3, **TINY))
    x, y = pixels(3, seed=8), np.array([2, 0, 1], np.int32)
    restored = assert_save_load_roundtrip(train, [x, y], tmp_path)
    served = hyperspherical_inference_model(restored)
    assert len(served.inputs) == 1
    np.testing.assert_allclose(np.asarray(served(x)), np.asarray(train([x, y])), atol=1e-6)


def test_classifier_keeps_the_pretrained_structure_of_a_given_backbone():
    """A Keras model as backbone is used as is (the presets' weights depend on the layer names)."""
    backbone = keras.Sequential([keras.Input((None, None, 1)), keras.layers.Conv2D(4, 3)], name="backbone")
    model = image_classifier(backbone, "gap_fc", 2)
    assert model.get_layer("backbone") is backbone and model.name == "backbone_gap_fc"
    assert [layer.name for layer in model.layers] == ["images", "preprocess", "backbone", "gap", "dense_head"]
    assert model(pixels(2, shape=(9, 7, 1))).shape == (2, 2)
    assert model(pixels(1, shape=(12, 20, 1))).shape == (1, 2)


# ----------------------------------------------------------------------------------------------------- retrieval


@pytest.mark.parametrize("pooling", RETRIEVAL_POOLINGS)
def test_embeddings_are_unit_vectors_matching_their_pipeline(pooling):
    kwargs = {"pooling_kwargs": {"num_prototypes": 5, "epsilon": 2.0}} if pooling == "gsp" else {}
    model = embedding_model("small_convnet", pooling, 6, MEAN, STD, **kwargs, **TINY)
    x = pixels(5, seed=2)
    embeddings = model(x)
    assert embeddings.shape == (5, 6) and embeddings.dtype == tf.float32
    np.testing.assert_allclose(np.linalg.norm(np.asarray(embeddings, np.float64), axis=1), 1.0, atol=1e-6)
    features = backbone_features(model, x)
    if pooling == "gap":
        pooled = features.mean(axis=(1, 2))
    else:
        pooled = np.asarray(model.get_layer("gsp")(features.astype(np.float32)), np.float64)
    expected = normalize_rows_np(dense_np(model, "embedding", pooled))
    np.testing.assert_allclose(np.asarray(embeddings), expected, rtol=1e-5, atol=1e-5)


def test_proxy_training_model_outputs_the_cosines_to_the_proxies():
    model = embedding_model("small_convnet", "gap", 6, MEAN, STD, **TINY)
    train = proxy_training_model(model, num_classes=3, num_proxies=2)
    x = pixels(4, seed=3)
    similarities = np.asarray(train(x))
    assert similarities.shape == (4, 3, 2)
    proxies = normalize_rows_np(np.asarray(train.get_layer("proxies").proxies, np.float64))
    expected = np.einsum("bd,kmd->bkm", np.asarray(model(x), np.float64), proxies)
    np.testing.assert_allclose(similarities, expected, atol=1e-5)
    served = keras.Model(train.inputs[0], train.get_layer("proxies").input)
    np.testing.assert_allclose(np.asarray(served(x)), np.asarray(model(x)), atol=0)


def test_embedding_model_accepts_a_keras_applications_backbone():
    backbone = keras.applications.MobileNetV2(include_top=False, weights=None, input_shape=(32, 32, 3), alpha=0.35)
    model = embedding_model(backbone, "gap", 8, MEAN, STD)
    assert model.get_layer(backbone.name) is backbone
    x = pixels(2, shape=(32, 32, 3))
    embeddings = np.asarray(model(x), np.float64)
    assert embeddings.shape == (2, 8)
    # An untrained MobileNetV2 gives ~1e-10 features (below the norm floor): compare directions.
    expected = dense_np(model, "embedding", backbone_features(model, x, backbone.name).mean(axis=(1, 2)))
    np.testing.assert_allclose(normalize_rows_np(embeddings), normalize_rows_np(expected), atol=1e-4)


# ------------------------------------------------------------------------------------------------------ few-shot


def _episode(ways, shots, queries=2, seed=4):
    support_labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(ways), shots)).astype(np.int32)
    return pixels(ways * queries, seed), pixels(ways * shots, seed + 1), support_labels


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_protonet_logits_equal_numpy_class_means(metric):
    ways, shots = 3, 2
    model = few_shot_model("small_convnet", "protonet", ways, MEAN, STD, head_kwargs={"metric": metric, "scale": 2.0},
                           **TINY)
    query, support, labels = _episode(ways, shots)
    logits = model([query, support, labels])
    assert logits.shape == (len(query), ways) and logits.dtype == tf.float32
    q = backbone_features(model, query).mean(axis=(1, 2))
    s = backbone_features(model, support).mean(axis=(1, 2))
    prototypes = np.stack([s[labels == k].mean(0) for k in range(ways)])
    if metric == "euclidean":
        expected = -2.0 * ((q[:, None, :] - prototypes[None]) ** 2).sum(-1)
    else:
        expected = 2.0 * normalize_rows_np(q) @ normalize_rows_np(prototypes).T
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shots", [1, 3])
def test_emd_logits_equal_the_head_on_the_backbone_features(shots):
    """K = 1: the support maps themselves (ordered by label) are the node sets; K > 1: the class-mean maps."""
    ways = 3
    model = few_shot_model("small_convnet", "emd", ways, MEAN, STD, **TINY)
    config = model.get_layer("emd_head").get_config()
    assert config["method"] == "sinkhorn" and config["scale"] == 12.5
    query, support, labels = _episode(ways, shots)
    logits = np.asarray(model([query, support, labels]))
    assert logits.shape == (len(query), ways)
    s = backbone_features(model, support)
    nodes = np.stack([s[labels == k].mean(0) for k in range(ways)])
    if shots == 1:
        np.testing.assert_array_equal(nodes, s[np.argsort(labels)])
    head = EMDHead(scale=12.5, method="sinkhorn")
    expected = np.asarray(head([backbone_features(model, query).astype(np.float32), nodes.astype(np.float32)]))
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("head", FEW_SHOT_HEADS)
def test_few_shot_model_trains_one_episode_step(head):
    """One ``train_on_batch`` on an episode reaches the backbone: its weights change and the loss is the
    cross-entropy of the logits computed before the step."""
    model = few_shot_model("small_convnet", head, 2, MEAN, STD, **TINY)
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    query, support, labels = _episode(2, 2, seed=6)
    query_labels = np.repeat(np.arange(2), 2).astype(np.int32)
    kernel = model.get_layer("small_convnet").get_layer("conv0").kernel
    before = np.array(kernel)
    logits = np.asarray(model([query, support, labels], training=True), np.float64)
    log_softmax = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
        - logits.max(1, keepdims=True)
    loss = model.train_on_batch([query, support, labels], query_labels)
    np.testing.assert_allclose(loss, -log_softmax[np.arange(4), query_labels].mean(), rtol=1e-4)
    assert np.all(np.isfinite(np.asarray(kernel))) and not np.allclose(np.asarray(kernel), before)


def test_few_shot_and_retrieval_models_under_mixed_precision():
    """The transport runs in float32 under ``mixed_float16``: outputs finite and close to the float32 model's."""
    episode = list(_episode(2, 2, seed=9))
    emd = few_shot_model("small_convnet", "emd", 2, **TINY)
    assert_mixed_precision(lambda: few_shot_model("small_convnet", "emd", 2, **TINY), episode, emd, atol=0.1)
    gsp = embedding_model("small_convnet", "gsp", 4, pooling_kwargs={"num_prototypes": 4}, **TINY)
    assert_mixed_precision(lambda: embedding_model("small_convnet", "gsp", 4, pooling_kwargs={"num_prototypes": 4},
                                                   **TINY), pixels(3, seed=9), gsp, atol=0.05)


def test_emd_few_shot_model_exports_to_saved_model(tmp_path):
    """The default ``method="sinkhorn"`` exports: a SavedModel run in a fresh process reproduces the logits."""
    model = few_shot_model("small_convnet", "emd", 2, **TINY)
    query, support, labels = _episode(2, 2, seed=10)
    episode = [query.astype(np.float32), support.astype(np.float32), labels]
    assert_export_parity(model, episode, tmp_path, atol=1e-4, onnx=False)


# ------------------------------------------------------------------------------------------- round trip, errors

BUILDERS = {
    "gap_fc": lambda: image_classifier("small_convnet", "gap_fc", 3, **TINY),
    "mpw": lambda: image_classifier("small_convnet", "mpw", 3, head_kwargs={"num_proxies": 2}, **TINY),
    "hyperspherical_training": lambda: hyperspherical_training_model(
        image_classifier("small_convnet", "hyperspherical", 3, **TINY)),
    "gsp_proxies": lambda: proxy_training_model(
        embedding_model("small_convnet", "gsp", 4, pooling_kwargs={"num_prototypes": 4}, **TINY), 3),
    "emd": lambda: few_shot_model("small_convnet", "emd", 2, **TINY),
    "protonet": lambda: few_shot_model("small_convnet", "protonet", 2, **TINY),
}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_keras_round_trip_reproduces_outputs(kind, tmp_path):
    model = BUILDERS[kind]()
    if kind in ("emd", "protonet"):
        x = list(_episode(2, 2, seed=7))
    elif kind == "hyperspherical_training":
        x = [pixels(3, seed=7), np.array([0, 1, 2], np.int32)]
    else:
        x = pixels(3, seed=7)
    assert_save_load_roundtrip(model, x, tmp_path, atol=1e-6)


@pytest.mark.parametrize("build, argument", [
    (lambda: image_classifier("small_convnet", "softmax", **TINY), "head"),
    (lambda: image_classifier("small_convnet", "gap_fc", 0, **TINY), "num_classes"),
    (lambda: image_classifier("small_convnet", "hyperspherical", 1, **TINY), "num_classes"),
    (lambda: image_classifier("small_convnet", "hyperspherical", 3, head_kwargs={"dim": 0}, **TINY), "dim"),
    (lambda: image_classifier("small_convnet", "gap_fc", 3, head_kwargs=[1], **TINY), "head_kwargs"),
    (lambda: image_classifier("resnet7", "gap_fc", 3), "backbone"),
    (lambda: image_classifier("small_convnet", "gap_fc", 3, input_shape=(16, 16)), "input_shape"),
    (lambda: image_classifier("small_convnet", "gap_fc", 3, pixel_std=0.0, **TINY), "pixel_std"),
    (lambda: image_classifier("small_convnet", "gap_fc", 3, pixel_mean=float("nan"), **TINY), "pixel_mean"),
    (lambda: embedding_model("small_convnet", "max", **TINY), "pooling"),
    (lambda: embedding_model("small_convnet", "gap", 0, **TINY), "embedding_dim"),
    (lambda: embedding_model("small_convnet", "gap", pooling_kwargs={"num_prototypes": 3}, **TINY),
     "pooling_kwargs"),
    (lambda: embedding_model("small_convnet", "gap", backbone_kwargs="wide"), "backbone_kwargs"),
    (lambda: few_shot_model("small_convnet", "relation", **TINY), "head"),
    (lambda: few_shot_model("small_convnet", "emd", 0, **TINY), "ways"),
    (lambda: few_shot_model("small_convnet", "protonet", head_kwargs={"metric": "l1"}, **TINY), "metric"),
    (lambda: few_shot_model("small_convnet", "emd", head_kwargs={"epsilonn": 0.1}, **TINY), "head_kwargs"),
    (lambda: image_classifier("small_convnet", "mpw", head_kwargs={"num_classes": 3}, **TINY), "head_kwargs"),
    (lambda: embedding_model("small_convnet", "gsp", pooling_kwargs={"name": "p"}, **TINY), "pooling_kwargs"),
    (lambda: image_classifier("small_convnet", "gap_fc", 3, pixel_mean=125.0, pixel_std=0.25, **TINY), "pixel_mean"),
    (lambda: embedding_model("small_convnet", "gap", pixel_mean=0.5, pixel_std=60.0, **TINY), "pixel_std"),
    (lambda: proxy_training_model(image_classifier("small_convnet", "gap_fc", 3, **TINY), 3), "model"),
    (lambda: image_classifier("small_convnet", "hyperspherical", 3, head_kwargs={"dim": 1}, **TINY), "dim"),
    (lambda: hyperspherical_training_model(image_classifier("small_convnet", "gap_fc", 3, **TINY)), "model"),
    (lambda: hyperspherical_training_model(hyperspherical_training_model(
        image_classifier("small_convnet", "hyperspherical", 3, **TINY))), "model"),
    (lambda: proxy_training_model(few_shot_model("small_convnet", "protonet", 2, **TINY), 3), "model"),
    (lambda: proxy_training_model(embedding_model("small_convnet", "gap", 4, **TINY), 0), "num_classes"),
    (lambda: hyperspherical_inference_model(image_classifier("small_convnet", "gap_fc", 3, **TINY)), "train"),
])
def test_bad_arguments_are_named(build, argument):
    with pytest.raises(ValueError, match=f"`{argument}`"):
        build()


def test_unknown_head_lists_the_known_ones():
    with pytest.raises(ValueError, match="'gap_fc', 'hyperspherical', 'mpw'"):
        image_classifier("small_convnet", "arcface", **TINY)
    with pytest.raises(ValueError, match="'emd', 'protonet'"):
        few_shot_model("small_convnet", "matching", **TINY)
    with pytest.raises(ValueError, match="'gap', 'gsp'"):
        embedding_model("small_convnet", "attention", **TINY)
