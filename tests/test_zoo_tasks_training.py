"""The few-shot and retrieval training pieces the presets' recipes use, on small models.

Checked against independent computations: the whole few-shot model on each episode (for the embed-once evaluation),
an uninterrupted run (for a resumed meta-training), the episode sampler's own draws, a preset built by hand.
"""
import keras
import numpy as np
import pytest

import zoo
from training.data.episodes import EpisodeBatches, EpisodeSampler, episode_dataset
from training.evaluation.few_shot import few_shot_accuracy
from training.recipes.few_shot import meta_train
from zoo.tasks import few_shot_parts

SMALL = dict(input_shape=(28, 28, 1), backbone_kwargs={"width": 8, "feature_dim": 8})


def _images(n=60, classes=4, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(classes), n // classes)
    images = rng.uniform(0, 255, (len(labels), 28, 28, 1)).astype(np.float32)
    images[..., :7, :] += 40.0 * labels[:, None, None, None]  # a class-dependent band, so accuracies are not chance
    return np.clip(images, 0, 255), labels


def test_episode_index_draws_the_same_episode_whatever_came_before():
    _, labels = _images()
    first = EpisodeSampler(labels, ways=3, shots=2, queries=3, seed=5)
    second = EpisodeSampler(labels, ways=3, shots=2, queries=3, seed=5)
    second.sample(), second.sample()  # a different history of the sampler's own stream
    for index in (0, 7):
        for a, b in zip(first.episode(index), second.episode(index)):
            np.testing.assert_array_equal(a, b)
    support, support_label, query, query_label = first.episode(3)
    assert len(set(support) | set(query)) == 3 * 5  # distinct samples
    assert all(len(set(labels[support[support_label == k]])) == 1 for k in range(3))
    np.testing.assert_array_equal(np.unique(labels[support]), np.unique(labels[query]))


@pytest.mark.parametrize("head, head_kwargs", [("emd", None), ("emd", {"method": "exact"}), ("protonet", None)])
def test_embed_once_evaluation_equals_the_whole_model_on_each_episode(head, head_kwargs, monkeypatch):
    """On TensorFlow the episodes run under XLA, but for the exact EMD (graph mode: its host call cannot compile)."""
    import tensorflow as tf

    compiled, function = [], tf.function

    def recording_function(fn=None, **options):
        if getattr(fn, "__name__", None) == "classify":
            compiled.append(options.get("jit_compile"))
        return function(fn, **options)

    monkeypatch.setattr(tf, "function", recording_function)
    images, labels = _images()
    model = zoo.few_shot_model("small_convnet", head, ways=3, head_kwargs=head_kwargs, **SMALL)
    embed, classify = few_shot_parts(model)
    sampler = EpisodeSampler(labels, ways=3, shots=2, queries=4, seed=1)
    support, support_label, query, _ = sampler.episode(0)
    whole = model([images[query], images[support], support_label], training=False)
    parts = classify(embed(images[query]), embed(images[support]), support_label)
    np.testing.assert_allclose(np.asarray(parts), np.asarray(whole), rtol=1e-5, atol=1e-5)

    expected = []
    for index in range(4):
        support, support_label, query, query_label = sampler.episode(index)
        logits = model([images[query], images[support], support_label], training=False)
        expected.append(np.mean(np.argmax(np.asarray(logits), axis=-1) == query_label))
    result = few_shot_accuracy(model, images, labels, ways=3, shots=2, queries=4, episodes=4, seed=1)
    assert compiled == [head_kwargs is None]
    assert result["episodes"] == 4
    assert result["mean"] == pytest.approx(np.mean(expected), abs=1e-9)
    assert result["ci95"] == pytest.approx(1.96 * np.std(expected, ddof=1) / 2.0, abs=1e-9)


def _meta_model():
    keras.utils.set_random_seed(0)
    return zoo.few_shot_model("small_convnet", "protonet", ways=3, **SMALL), keras.optimizers.SGD(0.01, momentum=0.9)


def test_meta_training_resumed_from_its_checkpoint_equals_an_uninterrupted_run(tmp_path):
    images, labels = _images()
    options = dict(ways=3, shots=1, queries=3, seed=2, jit_compile=False, verbose=0, checkpoint_every=2)
    model, optimizer = _meta_model()
    meta_train(model, images, labels, 6, optimizer, checkpoint_dir=str(tmp_path / "whole"), **options)

    interrupted, optimizer = _meta_model()
    meta_train(interrupted, images, labels, 4, optimizer, checkpoint_dir=str(tmp_path / "cut"), **options)
    resumed, optimizer = _meta_model()  # a new process: fresh weights and optimizer, restored from the checkpoint
    history = meta_train(resumed, images, labels, 6, optimizer, checkpoint_dir=str(tmp_path / "cut"), **options)
    assert history["episode"] == [6]  # only episodes 5 and 6 ran
    for a, b in zip(model.get_weights(), resumed.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    untrained, _ = _meta_model()
    assert any(not np.allclose(a, b) for a, b in zip(model.get_weights(), untrained.get_weights()))


@pytest.mark.parametrize("method", ["sinkhorn", "exact"])
def test_meta_training_records_the_emd_solvers_signals_on_its_first_episode(method):
    """An EMD model's meta-training history holds, at every logged episode, its solver's marginal error and
    converged share (and Sinkhorn's iterations) on the first training episode: the last ones are those of the
    trained head on that episode's features, recomputed here through the embed-once parts and checked against the
    plans' marginals in NumPy."""
    images, labels = _images()
    keras.utils.set_random_seed(0)
    model = zoo.few_shot_model("small_convnet", "emd", ways=3, head_kwargs={"threshold": 0.01, "method": method},
                               **SMALL)
    history = meta_train(model, images, labels, 4, keras.optimizers.SGD(0.01), ways=3, shots=1, queries=3, seed=2,
                         jit_compile=False, verbose=0, log_every=2)
    assert history["episode"] == [2, 4]
    signals = ["emd_head_marginal_error", "emd_head_converged"]
    assert sorted(set(history) - {"episode", "loss", "accuracy"}) == sorted(
        signals + (["emd_head_sinkhorn_iterations"] if method == "sinkhorn" else []))
    assert all(len(history[name]) == 2 for name in signals)

    (query, support, support_labels), _ = EpisodeBatches(images, labels, 4, 3, 1, 3, 2)[0]
    embed, _ = few_shot_parts(model)
    head = model.get_layer("emd_head")
    classes = model.get_layer("class_means")([embed(support), support_labels])
    q, s = (keras.ops.reshape(x, (x.shape[0], -1, x.shape[-1])) for x in (embed(query), classes))
    _, a, _, result = head.transport(q, s)
    plan, a = keras.ops.convert_to_numpy(result.plan), keras.ops.convert_to_numpy(a)
    row_error = np.sum(np.abs(plan.sum(-1) - a), axis=-1) / np.sum(a, axis=-1)  # per (query, class) problem
    if method == "exact":  # the network simplex's flow meets both marginals up to float32 round-off
        assert history["emd_head_marginal_error"][-1] <= 1e-6 and np.max(row_error) <= 1e-6
        assert history["emd_head_converged"][-1] == 1.0
        return
    assert history["emd_head_marginal_error"][-1] == pytest.approx(float(np.mean(row_error)), rel=1e-4, abs=1e-7)
    assert history["emd_head_converged"][-1] == pytest.approx(float(np.mean(row_error <= 0.01 * (1 + 1e-5))))
    assert history["emd_head_sinkhorn_iterations"][-1] == int(np.max(keras.ops.convert_to_numpy(result.iterations)))


def test_meta_training_refuses_a_tf_train_checkpoint_in_one_line(tmp_path):
    """A ``tf.train`` checkpoint (what meta-training wrote before it ran on every backend) is not silently ignored:
    starting over would discard its episodes without a word."""
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-100"\n')
    images, labels = _images()
    model, optimizer = _meta_model()
    with pytest.raises(ValueError, match="^`checkpoint_dir` .* holds a tf.train checkpoint"):
        meta_train(model, images, labels, 2, optimizer, ways=3, shots=1, queries=3, checkpoint_dir=str(tmp_path),
                   jit_compile=False, verbose=0)


def test_episode_batches_are_the_episode_datasets_batches():
    """The NumPy episodes ``model.fit`` reads on every backend and the ``tf.data`` pipeline hold the same batches,
    episode ``i`` being the sampler's episode ``i``."""
    images, labels = _images()
    batches = EpisodeBatches(images, labels, 3, ways=3, shots=2, queries=2, seed=9)
    sampler = EpisodeSampler(labels, ways=3, shots=2, queries=2, seed=9)
    for index, ((query, support, support_labels), query_labels) in enumerate(
            episode_dataset(images, labels, 3, ways=3, shots=2, queries=2, seed=9).as_numpy_iterator()):
        (own_query, own_support, own_support_labels), own_query_labels = batches[index]
        support_index, support_label, query_index, query_label = sampler.episode(index)
        np.testing.assert_array_equal(own_query, images[query_index])
        np.testing.assert_array_equal(own_support, images[support_index])
        np.testing.assert_array_equal(own_support_labels, support_label)
        np.testing.assert_array_equal(own_query_labels, query_label)
        for a, b in ((query, own_query), (support, own_support), (support_labels, own_support_labels),
                     (query_labels, own_query_labels)):
            np.testing.assert_array_equal(a, b)
    assert len(batches) == 3 and own_query.dtype == np.float32 and own_query_labels.dtype == np.int32
    with pytest.raises(IndexError):
        batches[3]


def test_model_fit_on_the_episode_dataset_takes_the_meta_training_steps():
    """``model.fit`` on ``episode_dataset`` (what a user runs on a loaded few-shot preset) makes the same updates as
    ``meta_train`` on the same episodes."""
    images, labels = _images()
    model, optimizer = _meta_model()
    meta_train(model, images, labels, 3, optimizer, ways=3, shots=1, queries=3, seed=4, jit_compile=False, verbose=0)
    fitted, optimizer = _meta_model()
    fitted.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    fitted.fit(episode_dataset(images, labels, 3, ways=3, shots=1, queries=3, seed=4), epochs=1, verbose=0)
    for a, b in zip(model.get_weights(), fitted.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _penalized_meta_model():
    """A few-shot model whose ResNet backbone carries an L2 penalty (as the presets' recipes build it)."""
    keras.utils.set_random_seed(3)
    backbone = zoo.cifar_resnet(8, (28, 28, 1), widths=(4, 8, 8), l2=0.05, name="backbone")
    return zoo.few_shot_model(backbone, "protonet", ways=3, input_shape=(28, 28, 1)), keras.optimizers.SGD(0.05, 0.9)


def _meta_training_by_hand(images, labels, episodes, penalty, **options):
    """The episodic step written out with a ``tf.GradientTape``: each episode's query cross-entropy (plus the
    backbone's L2 penalty when ``penalty``), one SGD step per episode, the episodes in order. Returns the model and
    the episodes' losses."""
    import tensorflow as tf

    model, optimizer = _penalized_meta_model()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    sampler, losses = EpisodeSampler(labels, **options), []
    for index in range(episodes):
        support, support_label, query, query_label = sampler.episode(index)
        with tf.GradientTape() as tape:
            loss = loss_fn(query_label, model([images[query], images[support], support_label], training=True))
            objective = loss + tf.add_n(model.losses) if penalty else loss
        gradients = tape.gradient(objective, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        losses.append(float(loss))
    return model, losses


def test_meta_training_equals_the_episodic_step_written_out_in_tensorflow():
    """``meta_train`` (Keras' own training step, on every backend) against the step written out by hand: the
    query cross-entropy alone (the backbone's L2 penalty is pre-training's and left out), one step per episode, the
    episodes in order. The weights agree after 4 episodes; with the penalty included they would not."""
    images, labels = _images()
    options = dict(ways=3, shots=1, queries=3, seed=6)
    model, optimizer = _penalized_meta_model()
    assert len(model.losses) > 0  # a penalty to leave out
    history = meta_train(model, images, labels, 4, optimizer, jit_compile=False, verbose=0, log_every=2, **options)

    reference, losses = _meta_training_by_hand(images, labels, 4, penalty=False, **options)
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
    assert history["episode"] == [2, 4]
    np.testing.assert_allclose(history["loss"], [np.mean(losses[:2]), np.mean(losses[2:])], rtol=1e-5)
    penalized, _ = _meta_training_by_hand(images, labels, 4, penalty=True, **options)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(penalized.get_weights(), model.get_weights())) > 1e-3


@pytest.mark.parametrize("name", zoo.list_models())
def test_build_with_a_small_backbone_matches_the_builders_of_its_task(name):
    card_task = zoo.model_card(name)["task"]
    model = zoo.build(name, backbone="small_convnet")
    from zoo.registry import PRESETS

    spec = PRESETS[name]
    stats = dict(pixel_mean=spec.data.pixel_mean, pixel_std=spec.data.pixel_std, input_shape=(28, 28, 1))
    if card_task == "classification":
        expected = zoo.image_classifier("small_convnet", spec.architecture.head, 10, head_kwargs=spec.architecture.head_kwargs, **stats)
    elif card_task == "retrieval":
        expected = zoo.embedding_model("small_convnet", spec.architecture.pooling, spec.architecture.embedding_dim,
                                       pooling_kwargs=spec.architecture.pooling_kwargs or None, **stats)
    else:
        expected = zoo.few_shot_model("small_convnet", spec.architecture.head, spec.architecture.ways, head_kwargs=spec.architecture.head_kwargs,
                                      **stats)
    assert model.count_params() == expected.count_params()
    assert [w.shape for w in model.weights] == [w.shape for w in expected.weights]
    assert [i.name for i in model.inputs] == [i.name for i in expected.inputs]


def test_build_refuses_l2_on_a_backbone_without_it():
    with pytest.raises(ValueError, match="`l2`"):
        zoo.build("resnet20_gap_retrieval_fashion_mnist", backbone="small_convnet", l2=1e-4)
