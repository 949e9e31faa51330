"""``otzoo train``, ``evaluate`` and ``fine-tune`` on JAX or PyTorch in a process where TensorFlow cannot be imported,
as on a GPU machine with JAX or PyTorch only: a classification preset trains one epoch on a Fashion-MNIST slice, the
card names the backend, the run's log.csv holds the MPW head's Sinkhorn iterations, ``otzoo evaluate`` reproduces
the card's accuracy, and a fine-tune lowers its loss on the slice; the DeepEMD few-shot preset pre-trains one epoch
and meta-trains a few episodes (its card's history holds the EMD solver's signals), ``otzoo evaluate`` reproduces
its card's accuracies and a fine-tune on base-class episodes lowers its loss; a meta-training run resumed from its
backup ends with the weights of an uninterrupted one. TensorFlow is never loaded. Prints one JSON line; exits
non-zero when a check fails.

    KERAS_BACKEND=jax python tests/backends/train_without_tensorflow.py OUT_DIR
"""
import contextlib
import csv
import io
import json
import os
import re
import sys

import numpy as np
from no_tensorflow import block_tensorflow

block_tensorflow()

from otzoo.cli import main  # noqa: E402

out = sys.argv[1]
preset = "resnet20_mpw_fashion_mnist"
failures, record = [], {"backend": os.environ.get("KERAS_BACKEND")}


def command(*argv):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = main(list(argv))
    sys.stderr.write(printed.getvalue())
    if status != 0:
        failures.append(f"otzoo {' '.join(argv)} exited {status}")
    return printed.getvalue()


command("train", preset, "--limit", "384", "--epochs", "1", "--out", os.path.join(out, "run"))
with open(os.path.join(out, "run", "metadata.json")) as handle:
    card = json.load(handle)
record["card_backend"] = card["backend"]
with open(os.path.join(out, "run", "log.csv"), newline="") as handle:  # the MPW head's signals, logged every run
    record["logged_sinkhorn_iterations"] = [float(row["mpw_head_sinkhorn_iterations"])
                                            for row in csv.DictReader(handle)]
if not record["logged_sinkhorn_iterations"] or min(record["logged_sinkhorn_iterations"]) < 1:
    failures.append(f"log.csv's Sinkhorn iterations: {record['logged_sinkhorn_iterations']}")
printed = command("evaluate", os.path.join(out, "run"))
found = float(re.search(r"accuracy ([0-9.]+)", printed).group(1))
record["accuracy"] = [found, card["metrics"]["accuracy"]]
command("fine-tune", preset, "--limit", "256", "--out", os.path.join(out, "tuned"))
with open(os.path.join(out, "tuned", "metadata.json")) as handle:
    record["fine_tune_loss_before_after"] = json.load(handle)["fine_tuned"]["loss_on_slice_before_after"]

few_shot = "resnet20_emd_fewshot_fashion_mnist"
command("train", few_shot, "--limit", "1024", "--epochs", "1", "--episodes", "3", "--recipe", "eval_episodes=3",
        "--out", os.path.join(out, "few_shot"))
with open(os.path.join(out, "few_shot", "metadata.json")) as handle:
    few_shot_card = json.load(handle)
record["few_shot_card_backend"] = few_shot_card["backend"]
record["few_shot_meta_training_episodes"] = few_shot_card["meta_training"]["episode"]
record["few_shot_meta_training_marginal_error"] = few_shot_card["meta_training"].get("emd_head_marginal_error")
if not record["few_shot_meta_training_marginal_error"]:
    failures.append("the few-shot card's meta-training history holds no EMD solver signals")
printed = command("evaluate", os.path.join(out, "few_shot"))
for setting, expected in few_shot_card["metrics"].items():
    reproduced = float(re.search(rf"{setting} ([0-9.]+)", printed).group(1))
    record[f"few_shot_{setting}"] = [reproduced, expected["mean"]]
    if abs(reproduced - expected["mean"]) > 1e-4:
        failures.append(f"evaluate {few_shot}: {setting} {reproduced} vs the card's {expected['mean']}")
command("fine-tune", few_shot, "--limit", "512", "--out", os.path.join(out, "few_shot_tuned"))
with open(os.path.join(out, "few_shot_tuned", "metadata.json")) as handle:
    before, after = json.load(handle)["fine_tuned"]["loss_on_slice_before_after"]
record["few_shot_fine_tune_loss_before_after"] = [before, after]
if not after < before:
    failures.append(f"fine-tune {few_shot}: loss {before} -> {after}")
if few_shot_card["backend"] != record["backend"] or record["few_shot_meta_training_episodes"] != [3]:
    failures.append(f"the few-shot card names {few_shot_card['backend']}, episodes "
                    f"{record['few_shot_meta_training_episodes']}")


def meta_trained(episodes, checkpoint_dir):
    """A small few-shot model meta-trained ``episodes`` episodes (backed up every 2 into ``checkpoint_dir``)."""
    import keras

    import zoo
    from training.recipes.few_shot import meta_train

    keras.utils.set_random_seed(0)
    model = zoo.few_shot_model("small_convnet", "emd", ways=3, input_shape=(28, 28, 1),
                               backbone_kwargs={"width": 8, "feature_dim": 8})
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 12)
    images = rng.uniform(0, 255, (len(labels), 28, 28, 1)).astype(np.float32)
    meta_train(model, images, labels, episodes, keras.optimizers.SGD(0.01, momentum=0.9), ways=3, shots=1,
               queries=3, seed=1, checkpoint_dir=checkpoint_dir, checkpoint_every=2, verbose=0)
    return model.get_weights()


whole = meta_trained(4, os.path.join(out, "meta_whole"))
meta_trained(2, os.path.join(out, "meta_cut"))  # a run stopped after episode 2, then started again
resumed = meta_trained(4, os.path.join(out, "meta_cut"))
record["meta_training_resumed_max_difference"] = max(float(np.max(np.abs(a - b))) for a, b in zip(whole, resumed))
if record["meta_training_resumed_max_difference"] > 1e-5:
    failures.append(f"meta-training resumed: weights differ by {record['meta_training_resumed_max_difference']}")
record["tensorflow_loaded"] = "tensorflow" in sys.modules
if card["backend"] != record["backend"]:
    failures.append(f"the card names {card['backend']}")
if found != card["metrics"]["accuracy"]:
    failures.append(f"evaluate: accuracy {found} vs the card's {card['metrics']['accuracy']}")
before, after = record["fine_tune_loss_before_after"]
if not after < before:
    failures.append(f"fine-tune: loss {before} -> {after}")
if record["tensorflow_loaded"]:
    failures.append("tensorflow was imported")
print(json.dumps(dict(record, failures=failures)))
sys.exit(1 if failures else 0)
