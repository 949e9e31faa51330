"""``otzoo train``, ``evaluate`` and ``fine-tune`` on JAX or PyTorch in a process where TensorFlow cannot be imported,
as on a GPU machine with JAX or PyTorch only: a classification preset trains one epoch on a Fashion-MNIST slice, the
card names the backend, ``otzoo evaluate`` reproduces the card's accuracy, and a fine-tune lowers its loss on the
slice; TensorFlow is never loaded. Prints one JSON line; exits non-zero when a check fails.

    KERAS_BACKEND=jax python tests/backends/train_without_tensorflow.py OUT_DIR
"""
import contextlib
import io
import json
import os
import re
import sys

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
printed = command("evaluate", os.path.join(out, "run"))
found = float(re.search(r"accuracy ([0-9.]+)", printed).group(1))
record["accuracy"] = [found, card["metrics"]["accuracy"]]
command("fine-tune", preset, "--limit", "256", "--out", os.path.join(out, "tuned"))
with open(os.path.join(out, "tuned", "metadata.json")) as handle:
    record["fine_tune_loss_before_after"] = json.load(handle)["fine_tuned"]["loss_on_slice_before_after"]
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
