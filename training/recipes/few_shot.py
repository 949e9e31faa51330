"""The few-shot presets' recipe: pre-train on the base classes, meta-train on base episodes, test on novel ones.

DeepEMD (paper 004, Sec. 4) on Fashion-MNIST: base classes 0-4 (training images), novel classes 5-9 (test images).

1. Pre-training: the backbone + global average pooling + ``Dense(5)`` (``zoo.image_classifier(..., "gap_fc")``)
   trained by cross-entropy on the base images with the classification recipe (SGD, cosine decay, L2, pad-crop-flip);
   ``keras.callbacks.BackupAndRestore`` makes it resumable; the backbone's weights are kept in
   ``pretrained_backbone.weights.h5``, and ``pretrained=`` re-uses them from another run of the same recipe (the EMD
   preset and its ProtoNet baseline share one pre-training).
2. Meta-training of the few-shot model (``zoo.few_shot_model``, the preset's head) on 5-way 1-shot episodes of the
   base classes (15 queries per class), one episode a step (``training.episodes.meta_train``, checkpointed).
3. Evaluation: 5-way 1-shot and 5-shot episodes of the novel classes, a fixed episode seed, mean accuracy +- 95 %
   interval (``training.episodes.few_shot_accuracy``).
"""
import os
import time

import keras
import numpy as np
import tensorflow as tf

from ot_layers.validation import check_positive_int
from training.data.episodes import EpisodeSampler
from training.data.fashion_mnist import fashion_mnist_split
from training.data.pipelines import image_dataset
from training.evaluation.few_shot import few_shot_accuracy
from training.recipes.common import (
    preset_recipe,
    reproducing_command,
    run_options,
    sgd_cosine,
    standard_callbacks,
    write_preset,
)
from zoo.loading import build, load, model_card
from zoo.models import image_classifier
from zoo.registry import PRESETS

PRETRAINED_FILE = "pretrained_backbone.weights.h5"


def few_shot_scores(model, name, recipe, limit=None, episodes=None, verbose=0):
    """The card's metrics: ``{"5way_1shot": {"mean", "ci95", "episodes"}, ...}`` on the novel classes' test images
    (the first ``limit`` test images before the class filter), ``episodes`` (default the recipe's) per setting."""
    images, labels = fashion_mnist_split("few_shot", "novel", limit=limit, normalize=False)
    ways = PRESETS[name]["ways"]
    metrics = {}
    for shots in recipe["eval_shots"]:
        result = few_shot_accuracy(model, images, labels, ways, shots, recipe["eval_queries"],
                                   episodes or recipe["eval_episodes"], recipe["eval_seed"], verbose=verbose)
        metrics[f"{ways}way_{shots}shot"] = {key: round(value, 4) if isinstance(value, float) else value
                                             for key, value in result.items()}
    return metrics


def _pretrained_path(pretrained):
    path = os.path.join(pretrained, PRETRAINED_FILE) if os.path.isdir(pretrained) else pretrained
    if not os.path.isfile(path):
        raise FileNotFoundError(f"`pretrained`: no pre-trained backbone at {path!r} (give a run directory of a "
                                f"few-shot preset holding {PRETRAINED_FILE}, or that file).")
    return path


def pretrain_backbone(model, name, recipe, images, labels, out_dir, verbose=2, extra_callbacks=()):
    """Stage 1: train ``model``'s backbone with GAP + Dense on the base classes; returns the seconds it took."""
    spec = PRESETS[name]
    backbone = model.get_layer("backbone")
    classifier = image_classifier(backbone, "gap_fc", len(spec["train_classes"]), spec["pixel_mean"],
                                  spec["pixel_std"], name=f"{name}_pretraining")
    steps = len(images) // recipe["batch_size"]
    classifier.compile(optimizer=sgd_cosine(recipe, steps * recipe["pretrain_epochs"]),
                       loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"],
                       jit_compile=recipe["jit_compile"])
    train = image_dataset(images, labels, recipe["batch_size"], training=True, pad=recipe["pad"],
                          seed=recipe["seed"])
    start = time.time()
    classifier.fit(train, epochs=recipe["pretrain_epochs"], callbacks=standard_callbacks(out_dir)
                   + list(extra_callbacks), verbose=verbose)
    backbone.save_weights(os.path.join(out_dir, PRETRAINED_FILE))
    return time.time() - start


def train_few_shot_preset(name, out_dir, epochs=None, batch_size=None, limit=None, seed=None, episodes=None,
                          pretrained=None, verbose=2, strategy="auto", tensorboard=None):
    """Train few-shot preset ``name`` by its recipe; returns the card (also in ``out_dir/metadata.json``).

    ``epochs``: pre-training epochs; ``episodes``: meta-training episodes; ``batch_size``, ``seed``: the recipe's
    overrides; ``limit``: read only the first ``limit`` training images (before keeping the base classes);
    ``pretrained``: skip pre-training and start from the backbone another run of this recipe pre-trained (its run
    directory or its ``pretrained_backbone.weights.h5``).
    """

    recipe = preset_recipe(name, pretrain_epochs=epochs, batch_size=batch_size, seed=seed, meta_episodes=episodes)
    pretrained_file = _pretrained_path(pretrained) if pretrained is not None else None
    os.makedirs(out_dir, exist_ok=True)
    keras.utils.set_random_seed(recipe["seed"])
    images, labels = fashion_mnist_split("few_shot", "base", limit=limit, normalize=False, relabel=True)
    if len(images) < recipe["batch_size"]:
        raise ValueError(f"`limit`: {len(images)} base-class training images, fewer than one batch of "
                         f"{recipe['batch_size']}.")
    single_replica = "one_device" if strategy == "one_device" else tf.distribute.get_strategy()
    strategy, _, _, extra_callbacks = run_options(name, single_replica, None, tensorboard)
    with strategy.scope():
        model = build(name, l2=recipe["l2"])
    own_pretrained = os.path.join(out_dir, PRETRAINED_FILE)
    pretrain_time = 0.0
    if pretrained_file is not None:
        model.get_layer("backbone").load_weights(pretrained_file)
        recipe["pretrained_from"] = str(pretrained)
    elif os.path.isfile(own_pretrained):  # a resumed run: pre-training finished before
        model.get_layer("backbone").load_weights(own_pretrained)
    else:
        pretrain_time = pretrain_backbone(model, name, recipe, images, labels, out_dir, verbose, extra_callbacks)
    start = time.time()
    optimizer = keras.optimizers.SGD(recipe["meta_learning_rate"], momentum=recipe["meta_momentum"])
    history = meta_train(model, images, labels, recipe["meta_episodes"], optimizer, recipe["ways"], recipe["shots"],
                         recipe["queries"], seed=recipe["seed"],
                         checkpoint_dir=os.path.join(out_dir, "meta_checkpoints"), jit_compile=recipe["jit_compile"],
                         verbose=verbose)
    train_time = pretrain_time + time.time() - start
    metrics = few_shot_scores(model, name, recipe, verbose=verbose)
    return write_preset(model, name, out_dir, recipe, metrics, train_time, strategy,
                        reproducing_command(name, epochs=epochs, batch_size=batch_size, limit=limit, seed=seed,
                                            episodes=episodes, pretrained=pretrained),
                        meta_training=history,
                        evaluation=f"{recipe['eval_episodes']} episodes per setting of the novel classes' test "
                                   f"images, {recipe['eval_queries']} queries per class, episode seed "
                                   f"{recipe['eval_seed']}; mean query accuracy +- 1.96 std / sqrt(episodes)")


def evaluate_few_shot_preset(name, weights=None, limit=None, episodes=None):
    """Few-shot accuracies of preset ``name`` (pretrained, or ``weights``) on the card's novel-class episodes,
    next to the card's."""

    model = load(name, weights=weights)
    recipe = preset_recipe(name)
    metrics = few_shot_scores(model, name, recipe, limit=limit, episodes=episodes)
    images, _ = fashion_mnist_split("few_shot", "novel", limit=limit, normalize=False)
    return dict(metrics=metrics, card_metrics=model_card(name).get("metrics"), examples=len(images))


def meta_train(model, images, labels, episodes, optimizer, ways=5, shots=1, queries=15, seed=0, checkpoint_dir=None,
               checkpoint_every=100, jit_compile=True, log_every=50, verbose=1):
    """Episodic meta-training of a few-shot model (``zoo.few_shot_model``: inputs ``[query_images, support_images,
    support_labels]``, logits ``(queries * ways, ways)``) by cross-entropy on the query labels, one episode a step.

    Episode ``i`` is ``EpisodeSampler(labels, ways, shots, queries, seed).episode(i)`` drawn from ``images`` (raw
    pixels, as the model takes them). With ``checkpoint_dir`` the model, the optimizer and the episode counter are
    saved every ``checkpoint_every`` episodes (``tf.train.CheckpointManager``: written to a temporary file, then
    renamed) and a new call resumes after the last saved episode, drawing the same episodes an uninterrupted run
    would. Returns ``{"episode": [...], "loss": [...], "accuracy": [...]}``: means over each ``log_every`` episodes.
    """
    episodes = check_positive_int("episodes", episodes)
    sampler = EpisodeSampler(labels, ways, shots, queries, seed)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    done = tf.Variable(0, dtype=tf.int64, trainable=False)
    manager = None
    if checkpoint_dir is not None:
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, episodes_done=done)
        manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=1)
        if manager.latest_checkpoint:
            checkpoint.restore(manager.latest_checkpoint)

    @tf.function(jit_compile=jit_compile)
    def step(query, support, support_labels, query_labels):
        with tf.GradientTape() as tape:
            logits = model([query, support, support_labels], training=True)
            loss = loss_fn(query_labels, logits)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), query_labels), tf.float32)
        return loss, tf.reduce_mean(correct)

    history, window = {"episode": [], "loss": [], "accuracy": []}, []
    for index in range(int(done.numpy()), episodes):
        support, support_label, query, query_label = sampler.episode(index)
        loss, accuracy = step(tf.constant(images[query], tf.float32), tf.constant(images[support], tf.float32),
                              tf.constant(support_label, tf.int32), tf.constant(query_label, tf.int32))
        window.append((float(loss), float(accuracy)))
        done.assign(index + 1)
        if manager is not None and ((index + 1) % checkpoint_every == 0 or index + 1 == episodes):
            manager.save(checkpoint_number=index + 1)
        if (index + 1) % log_every == 0 or index + 1 == episodes:
            mean_loss, mean_accuracy = np.mean(window, axis=0)
            history["episode"].append(index + 1)
            history["loss"].append(float(mean_loss))
            history["accuracy"].append(float(mean_accuracy))
            window = []
            if verbose:
                print(f"episode {index + 1}/{episodes}: loss {mean_loss:.4f}, query accuracy {mean_accuracy:.4f}",
                      flush=True)
    return history


train = train_few_shot_preset
evaluate = evaluate_few_shot_preset
