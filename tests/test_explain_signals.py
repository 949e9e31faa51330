"""explain.signals: the plans, weights and flows pulled out of a model reproduce the model's own outputs, and agree
with POT / scikit-learn / closed forms computed independently."""
import keras
import numpy as np
import ot
import pytest
from PIL import Image
from sklearn.neighbors import NearestNeighbors

import explain
import zoo
from explain.signals import assignment_changes, feature_map_model
from ot_layers.tensor_ops import normalize_rows_np

SMALL = dict(width=8, feature_dim=16)


def _images(count, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (count, 28, 28, 1)).astype(np.float32)


def _head_input(model, name, images):
    return keras.Model(model.inputs[0], model.get_layer(name).input).predict(images, verbose=0)


def test_mpw_plans_reproduce_the_logits_and_match_pot_sinkhorn():
    model = zoo.image_classifier("small_convnet", "mpw", 4, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                                 head_kwargs=dict(num_proxies=2, threshold=0.0, max_iter=400))
    images = _images(3)
    result = explain.mpw_plans(model, images)
    assert result.plans.shape == (3, 4, 49, 2) and result.grid == (7, 7)
    np.testing.assert_allclose(result.logits, model.predict(images, verbose=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.contributions().sum(-1), result.logits, rtol=1e-5, atol=1e-6)
    # The plans against POT's converged Sinkhorn on a cost built here in NumPy (1 - cos, uniform marginals).
    features = _head_input(model, "mpw_head", images).reshape(3, 49, -1).astype(np.float64)
    proxies = model.get_layer("mpw_head").proxies.numpy().astype(np.float64)
    for b in range(3):
        for k in range(4):
            cost = 1.0 - normalize_rows_np(features[b]) @ normalize_rows_np(proxies[k]).T
            reference = ot.sinkhorn(np.full(49, 1 / 49), np.full(2, 0.5), cost, 0.1, numItermax=5000, stopThr=1e-12)
            np.testing.assert_allclose(result.plans[b, k], reference, atol=2e-6)
            np.testing.assert_allclose(result.inner[b, k], features[b] @ proxies[k].T, rtol=1e-4, atol=1e-4)


def test_gsp_weights_reproduce_the_pooled_output():
    model = zoo.embedding_model("small_convnet", "gsp", 8, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                                pooling_kwargs=dict(num_prototypes=4, epsilon=0.2))
    layer = model.get_layer("gsp")
    images = _images(3)
    pooled_by_layer = keras.Model(model.inputs[0], layer.output).predict(images, verbose=0)
    result = explain.gsp_weights(model, images)
    assert result.weights.shape == (3, 49) and result.grid == (7, 7)
    assert np.all(result.weights >= 0)
    np.testing.assert_allclose(result.weights.sum(1), 1.0, atol=1e-5)
    np.testing.assert_allclose(result.pooled, pooled_by_layer, rtol=1e-5, atol=1e-5)
    features = _head_input(model, "gsp", images).reshape(3, 49, -1)
    np.testing.assert_allclose(result.features, features, rtol=1e-6, atol=1e-6)
    assert result.weights.max() > 1.2 / 49  # a selection, not average pooling
    layer.average_pooling_warmup.assign(1.0)  # the warm-up flag: exactly global average pooling
    np.testing.assert_allclose(explain.gsp_weights(model, images).weights, 1.0 / 49, atol=1e-7)


def _episode():
    rng = np.random.default_rng(1)
    return _images(2, seed=2), rng.integers(0, 256, (3, 28, 28, 1)).astype(np.float32), np.arange(3)


def test_emd_flows_reproduce_the_logits_sinkhorn():
    model = zoo.few_shot_model("small_convnet", "emd", ways=3, input_shape=(28, 28, 1), backbone_kwargs=SMALL)
    query, support, labels = _episode()
    result = explain.emd_flows(model, query, support, labels)
    assert result.plans.shape == (2, 3, 49, 49) and result.query_grid == (7, 7) == result.support_grid
    np.testing.assert_allclose(result.logits, model([query, support, labels]).numpy(), rtol=1e-5, atol=1e-4)


def test_emd_flows_exact_match_pot_and_the_cross_reference_weights():
    model = zoo.few_shot_model("small_convnet", "emd", ways=3, input_shape=(28, 28, 1), backbone_kwargs=SMALL,
                               head_kwargs=dict(method="exact"))
    query, support, labels = _episode()
    result = explain.emd_flows(model, query, support, labels)
    np.testing.assert_allclose(result.logits, model([query, support, labels]).numpy(), rtol=1e-5, atol=1e-4)
    maps = keras.Model(model.inputs, model.get_layer("emd_head").input)([query, support, labels])
    q = maps[0].numpy().reshape(2, 49, -1).astype(np.float64)
    s = maps[1].numpy().reshape(3, 49, -1).astype(np.float64)
    for b in range(2):
        for k in range(3):
            # Eq. 11-12 by hand: relu(u_i . mean_j v_j) + 1e-3, normalized.
            a = np.maximum(q[b] @ s[k].mean(0), 0) + 1e-3
            w = np.maximum(s[k] @ q[b].mean(0), 0) + 1e-3
            np.testing.assert_allclose(result.query_weights[b, k], a / a.sum(), rtol=1e-4, atol=1e-7)
            np.testing.assert_allclose(result.support_weights[b, k], w / w.sum(), rtol=1e-4, atol=1e-7)
            qc, sc = q[b] - q[b].mean(1, keepdims=True), s[k] - s[k].mean(1, keepdims=True)
            cost = np.maximum(1.0 - normalize_rows_np(qc) @ normalize_rows_np(sc).T, 0)
            value = ot.emd2(a / a.sum(), w / w.sum(), cost)
            plan = result.plans[b, k]
            assert np.sum(plan * cost) == pytest.approx(value, abs=1e-5)
            np.testing.assert_allclose(plan.sum(1), result.query_weights[b, k], atol=1e-6)
            np.testing.assert_allclose(plan.sum(0), result.support_weights[b, k], atol=1e-6)


def test_prototype_geometry_is_what_the_layer_classifies_with():
    model = zoo.image_classifier("small_convnet", "hyperspherical", 5, input_shape=(28, 28, 1),
                                 backbone_kwargs=SMALL, head_kwargs=dict(dim=4))
    layer = model.get_layer("hyperspherical_head")
    layer.assignment.assign(np.array([2, 0, 1, 4, 3], dtype=np.int32))
    geometry = explain.prototype_geometry(model)
    prototypes = normalize_rows_np(layer.prototypes.numpy().astype(np.float64))
    np.testing.assert_allclose(geometry.assigned, prototypes[[2, 0, 1, 4, 3]], atol=1e-7)
    np.testing.assert_allclose(np.diag(geometry.cosines), 1.0, atol=1e-6)
    assert geometry.alignment is None  # no representatives before training with labels
    images = _images(4)
    embedding = keras.Model(model.inputs[0], model.get_layer("embedding").output).predict(images, verbose=0)
    np.testing.assert_allclose(normalize_rows_np(embedding) @ geometry.assigned.T, model.predict(images, verbose=0),
                               atol=1e-5)
    representatives = np.random.default_rng(0).standard_normal((5, 4))
    layer.representatives.assign(representatives.astype(np.float32))
    alignment = explain.prototype_geometry(layer).alignment
    np.testing.assert_allclose(alignment, normalize_rows_np(representatives) @ geometry.assigned.T, atol=1e-6)


def test_assignment_changes_from_assignments_counts_and_logs(tmp_path):
    history = [np.arange(4), np.array([1, 0, 2, 3]), np.array([1, 0, 2, 3]), np.array([3, 0, 2, 1])]
    np.testing.assert_array_equal(assignment_changes(history), [2, 0, 2])
    np.testing.assert_array_equal(assignment_changes([3, 0, 1]), [3, 0, 1])
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss,prototype_changes\n0,1.0,4\n1,0.5,1\n")
    np.testing.assert_array_equal(assignment_changes(str(log)), [4, 1])
    (tmp_path / "plain.csv").write_text("epoch,loss\n0,1.0\n")
    with pytest.raises(ValueError, match="prototype_changes"):
        assignment_changes(str(tmp_path / "plain.csv"))


def test_embeddings_and_neighbours_against_the_model_and_scikit_learn():
    classifier = zoo.image_classifier("small_convnet", "gap_fc", 3, input_shape=(28, 28, 1), backbone_kwargs=SMALL)
    images = _images(12)
    embeddings, source = explain.image_embeddings(classifier, images)
    gap = keras.Model(classifier.inputs[0], classifier.get_layer("gap").output).predict(images, verbose=0)
    np.testing.assert_allclose(embeddings, normalize_rows_np(gap), atol=1e-6)
    assert source == "pooled backbone features"
    embedder = zoo.embedding_model("small_convnet", "gap", 8, input_shape=(28, 28, 1), backbone_kwargs=SMALL)
    own, _ = explain.image_embeddings(embedder, images)
    np.testing.assert_allclose(own, embedder.predict(images, verbose=0), atol=1e-6)
    assert feature_map_model(embedder).output.shape[1:] == (7, 7, 16)
    indices, scores = explain.nearest_neighbours(embeddings[:4], embeddings, 3, exclude=[0, 1, 2, 3])
    reference = NearestNeighbors(n_neighbors=4, metric="cosine").fit(embeddings).kneighbors(embeddings[:4])
    np.testing.assert_array_equal(indices, reference[1][:, 1:])  # the query itself is its own nearest neighbour
    np.testing.assert_allclose(scores, 1.0 - reference[0][:, 1:], atol=1e-6)
    with pytest.raises(ValueError, match="`k`"):
        explain.nearest_neighbours(embeddings[:1], embeddings[:3], 3, exclude=[0])


def test_images_are_fitted_to_the_input_and_read_from_files(tmp_path):
    gray = np.random.default_rng(0).integers(0, 256, (28, 28)).astype(np.uint8)
    path = tmp_path / "item.png"
    Image.fromarray(gray).save(path)
    np.testing.assert_array_equal(explain.load_image_file(str(path), (28, 28, 1))[..., 0], gray)
    rgb = explain.load_image_file(str(path), (28, 28, 3))
    np.testing.assert_array_equal(rgb, np.repeat(gray[..., None], 3, axis=-1).astype(np.float32))
    np.testing.assert_allclose(explain.load_image_file(str(path), (14, 14, 1)).shape, (14, 14, 1))
    batch = explain.prepare_images(np.full((2, 28, 28, 3), 100.0), (32, 32, 1))
    assert batch.shape == (2, 32, 32, 1)
    np.testing.assert_allclose(batch, 100.0, atol=1e-3)  # luma of a gray pixel is the pixel
    with pytest.raises(FileNotFoundError, match="IMAGE"):
        explain.load_image_file(str(tmp_path / "missing.png"), (28, 28, 1))
    with pytest.raises(ValueError, match="`images`"):
        explain.prepare_images(np.zeros((2, 3, 4, 5, 6)), (28, 28, 1))


def test_read_training_log(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("epoch,accuracy,loss,val_accuracy,val_loss\n0,0.5,1.0,0.6,0.9\n1,0.7,0.6,,0.7\n")
    columns = explain.read_training_log(str(log))
    np.testing.assert_array_equal(columns["epoch"], [0, 1])
    np.testing.assert_array_equal(columns["val_accuracy"], [0.6, np.nan])
    (tmp_path / "bad.csv").write_text("step,loss\n0,1\n")
    with pytest.raises(ValueError, match="epoch"):
        explain.read_training_log(str(tmp_path / "bad.csv"))


def test_assignment_changes_of_epochs_without_a_count_are_nan(tmp_path):
    """An empty or NA ``prototype_changes`` cell (an epoch the callback did not run at) was cast to
    -9223372036854775808; it is NaN now (the counts then floats), and complete counts stay integers."""
    log = tmp_path / "log.csv"
    log.write_text("epoch,loss,prototype_changes\n0,1.0,4\n1,0.5,\n2,0.4,NA\n3,0.3,0\n")
    np.testing.assert_array_equal(assignment_changes(str(log)), [4, np.nan, np.nan, 0])
    np.testing.assert_array_equal(assignment_changes([2, None, 1]), [2, np.nan, 1])
    assert assignment_changes([2, 0, 1]).dtype.kind == "i"
