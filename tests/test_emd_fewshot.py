"""Episodes, few-shot evaluation, structured-FC fine-tuning, ResNet-12 and the Grid/Sampling patch embeddings."""
import functools

import numpy as np
import pytest
import tensorflow as tf

import keras_checks
from ot_layers import EMDHead, PatchExtractor, StructuredFC
from ot_layers.layers.local_embeddings import local_embedding_model
from training.data.episodes import EpisodeSampler
from training.evaluation.few_shot import evaluate_episodes, mean_and_ci95
from training.evaluation.structured_fc import class_mean_nodes, fine_tune_nodes, fine_tune_structured_fc
from zoo import resnet12, small_convnet


def test_episode_sampler_draws_disjoint_relabelled_episodes():
    labels = np.repeat(np.arange(8), 30)
    sampler = EpisodeSampler(labels, ways=5, shots=2, queries=4, seed=0)
    seen_classes = set()
    for _ in range(20):
        support, support_label, query, query_label = sampler.sample()
        assert support.shape == (10,) and query.shape == (20,)
        assert not set(support) & set(query)
        np.testing.assert_array_equal(support_label, np.repeat(np.arange(5), 2))
        np.testing.assert_array_equal(query_label, np.repeat(np.arange(5), 4))
        for k in range(5):  # one original class behind each episode label
            originals = set(labels[support[support_label == k]]) | set(labels[query[query_label == k]])
            assert len(originals) == 1
            seen_classes |= originals
    assert seen_classes == set(range(8))


@pytest.mark.parametrize("kwargs, match", [
    (dict(ways=9), "9-way"), (dict(shots=0), "shots"), (dict(queries=29, shots=2), "shots \\+ queries"),
])
def test_episode_sampler_rejects_impossible_episodes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EpisodeSampler(np.repeat(np.arange(8), 30), **kwargs)


def test_mean_and_ci95():
    values = np.array([0.2, 0.4, 0.6, 0.8])
    mean, ci = mean_and_ci95(values)
    assert mean == pytest.approx(0.5)
    assert ci == pytest.approx(1.96 * np.std(values, ddof=1) / 2)  # the sample standard deviation
    assert ci == pytest.approx(1.96 * 0.2581988897 / 2)  # sd of 0.2, 0.4, 0.6, 0.8 with n - 1
    with pytest.raises(ValueError, match="empty"):
        mean_and_ci95([])
    mean, ci = mean_and_ci95([0.7])  # one episode has no interval (it was 0: certainty)
    assert mean == 0.7 and np.isnan(ci)


def test_evaluate_episodes_scores_oracle_and_constant_classifiers():
    labels = np.repeat(np.arange(6), 20)
    features = np.eye(6)[labels].astype(np.float32)  # one-hot class codes: a prototype classifier is perfect

    def prototype(support, support_label, query):
        means = np.stack([support[support_label == k].mean(0) for k in range(5)])
        return query @ means.T

    def first_class(support, support_label, query):
        return np.eye(5)[[0] * len(query)]

    report = evaluate_episodes(features, labels, {"oracle": prototype, "first": first_class},
                               ways=5, shots=1, queries=3, episodes=30)
    assert report["oracle"] == {"mean": 1.0, "ci95": 0.0, "episodes": 30}
    assert report["first"]["mean"] == pytest.approx(0.2)


def _clustered_features(rng, ways=3, shots=5, nodes=4, dim=8):
    centres = rng.standard_normal((ways, nodes, dim))
    labels = np.repeat(np.arange(ways), shots)
    return (centres[labels] + 0.8 * rng.standard_normal((len(labels), nodes, dim))).astype(np.float32), labels


@pytest.mark.parametrize("method", ["sinkhorn", "exact"])
def test_fine_tuning_lowers_the_support_loss(method):
    features, labels = _clustered_features(np.random.default_rng(0))
    head = EMDHead(method=method)
    start = class_mean_nodes(tf.constant(features), tf.constant(labels), 3)
    np.testing.assert_allclose(start.numpy()[1], features[labels == 1].mean(0), atol=1e-6)

    def loss(nodes):
        return float(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, head([features, nodes]))))

    tune = tf.function(lambda f, y, n: fine_tune_nodes(head, f, y, n, steps=20, learning_rate=0.05))
    tuned = tune(features, tf.constant(labels, tf.int32), start)
    assert loss(tuned) < loss(start)


def test_fine_tune_structured_fc_assigns_the_nodes():
    features, labels = _clustered_features(np.random.default_rng(1))
    layer = StructuredFC(3, 4, head={"method": "sinkhorn"})
    fine_tune_structured_fc(layer, features, labels, steps=5)
    assert not np.allclose(layer.nodes.numpy(), class_mean_nodes(features, labels, 3).numpy())
    assert layer(features).shape == (15, 3)


def test_fine_tune_structured_fc_traces_once_for_every_episode(monkeypatch):
    """On TensorFlow every call built a new tf.function, so every episode traced the fine-tuning loop again; the
    compiled function is now kept per layer and settings, with the nodes a fresh tf.function gives."""
    import training.evaluation.structured_fc as structured_fc

    traces = []

    @functools.wraps(fine_tune_nodes)  # the settings fine_tune_structured_fc takes are read off its signature
    def counted(*args, **kwargs):  # runs once per trace, not per call of the traced function
        traces.append(kwargs)
        return fine_tune_nodes(*args, **kwargs)

    monkeypatch.setattr(structured_fc, "fine_tune_nodes", counted)
    layer = StructuredFC(3, 4, head={"method": "sinkhorn"})
    for episode in range(3):
        features, labels = _clustered_features(np.random.default_rng(10 + episode))
        layer.initialize_from_support(features, labels)
        fresh = tf.function(lambda f, y, n: fine_tune_nodes(layer.head, f, y, n, steps=5, seed=2))
        expected = fresh(features, tf.constant(labels, tf.int32), tf.convert_to_tensor(layer.nodes)).numpy()
        fine_tune_structured_fc(layer, features, labels, steps=5, seed=2)
        np.testing.assert_allclose(layer.nodes.numpy(), expected, rtol=0, atol=1e-6)
    assert len(traces) == 1
    fine_tune_structured_fc(layer, features, labels, steps=6, seed=2)  # other settings: compiled for them
    assert len(traces) == 2 and traces[-1]["steps"] == 6


def test_resnet12_shapes():
    model = resnet12()
    assert model.output_shape == (None, 5, 5, 640)
    assert 12.0e6 < model.count_params() < 12.6e6  # the standard ResNet-12 has ~12.4M parameters
    narrow = resnet12((28, 28, 1), widths=(8, 8, 16, 16), pool=(True, True, False, False))
    assert narrow(np.zeros((2, 28, 28, 1), np.float32)).shape == (2, 7, 7, 16)
    with pytest.raises(ValueError, match="widths"):
        resnet12(widths=(8, 8, 16))


def test_grid_patches_are_the_image_cells():
    images = np.random.default_rng(2).random((2, 8, 8, 1)).astype(np.float32)
    patches = PatchExtractor("grid", grid=2, patch_size=4)(images).numpy()
    assert patches.shape == (2, 4, 4, 4, 1)
    np.testing.assert_allclose(patches[1, 2], images[1, 4:, :4], atol=1e-6)  # row 1, column 0
    with pytest.raises(ValueError, match="grid"):
        PatchExtractor("grid", grid=3, patch_size=4)(images)


def test_sampled_patches_are_random_crops():
    images = np.random.default_rng(3).random((2, 16, 16, 3)).astype(np.float32)
    layer = PatchExtractor("sampling", num_patches=5, patch_size=6, seed=1)
    first, second = layer(images).numpy(), layer(images).numpy()
    assert first.shape == (2, 5, 6, 6, 3)
    assert not np.allclose(first, second)
    assert first.min() >= images.min() - 1e-6 and first.max() <= images.max() + 1e-6
    assert "mode=\"grid\"" in layer.export_blocker
    with pytest.raises(ValueError, match="crop_fraction"):
        PatchExtractor("sampling", crop_fraction=(0.8, 0.2))


@pytest.mark.parametrize("mode", ["fcn", "grid", "sampling"])
def test_local_embedding_models_feed_the_emd_head(mode, tmp_path):
    backbone = small_convnet((16, 16, 1), width=4, feature_dim=8)
    kwargs = {} if mode == "fcn" else dict(grid=2, num_patches=3, patch_size=16)
    model = local_embedding_model(backbone, (16, 16, 1), mode, **kwargs)
    images = np.random.default_rng(4).random((3, 16, 16, 1)).astype(np.float32)
    nodes = model(images)
    expected = {"fcn": (3, 4, 4, 8), "grid": (3, 4, 8), "sampling": (3, 3, 8)}[mode]
    assert tuple(nodes.shape) == expected
    assert EMDHead()([nodes, nodes]).shape == (3, 3)
    if mode == "grid":
        keras_checks.assert_save_load_roundtrip(model, images, tmp_path, atol=1e-6)


def test_local_embedding_model_refuses_patch_arguments_in_fcn_mode_and_names_every_mode():
    """``mode="fcn"`` took ``grid=3, num_patches=99`` without a word; a wrong mode's error left "fcn" out."""
    backbone = small_convnet((16, 16, 1), width=4, feature_dim=8)
    with pytest.raises(ValueError, match=r"^`mode` 'fcn' embeds the whole feature map and takes no patch "
                                         r"arguments, got \['grid', 'num_patches'\]"):
        local_embedding_model(backbone, (16, 16, 1), mode="fcn", grid=3, num_patches=99)
    for mode in ("FCN", "patches"):
        with pytest.raises(ValueError, match=r"^`mode` must be one of \['fcn', 'grid', 'sampling'\], got"):
            local_embedding_model(backbone, (16, 16, 1), mode=mode, grid=2)


@pytest.mark.parametrize("seed", [None, 1.5, -1, "0"])
def test_structured_fc_fine_tuning_names_a_bad_seed(seed):
    """A seed of ``None`` or ``1.5`` failed inside the traced function on TensorFlow (a long "in user code" trace),
    and NumPy's generator on JAX and PyTorch took ``None`` as fresh entropy."""
    features, labels = _clustered_features(np.random.default_rng(1))
    layer = StructuredFC(3, 4, head={"method": "sinkhorn"})
    with pytest.raises(ValueError, match=r"^`seed` must be an integer >= 0, got"):
        fine_tune_structured_fc(layer, features, labels, steps=2, seed=seed)
    with pytest.raises(ValueError, match=r"^`seed` must be an integer >= 0, got"):
        fine_tune_nodes(EMDHead(), features, labels, class_mean_nodes(features, labels, 3), steps=2, seed=seed)
    fine_tune_structured_fc(layer, features, labels, steps=2, seed=np.int64(3))
