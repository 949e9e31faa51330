"""One training process of the distributed and fault-tolerance tests.

``--strategy multi_worker`` (started by ``training.launch.launch_workers``, which sets ``TF_CONFIG``): creates the
``MultiWorkerMirroredStrategy`` first (before any other TensorFlow op, as TensorFlow requires) and trains with
``training.distributed.fit``'s multi-worker loop. ``--strategy default``: one process, ``training.distributed.fit``
= ``model.fit`` (with ``AtomicBackupAndRestore`` for ``--checkpoint``). The model comes from
``tests/distributed_models.py``, built under the strategy's scope. Every model and optimizer variable is written to
``OUT/worker-<index>.npz``, the history to ``OUT/worker-<index>.json``. ``--kill-at-step K`` with ``--kill-worker I``:
worker I sends itself SIGKILL right after its K-th training step of this run (a crash mid-epoch, after the
checkpoints written so far).
"""
import argparse
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from training.distributed.strategies import make_strategy, tf_config

STRATEGY = "multi_worker" if "--strategy=default" not in sys.argv else "auto"
strategy = make_strategy(STRATEGY)  # first: before any other TensorFlow operation

import keras  # noqa: E402
import numpy as np  # noqa: E402

import distributed_models as dm  # noqa: E402
from training.distributed.fit import fit


class SelfKill(keras.callbacks.Callback):
    """SIGKILL this process after its ``step``-th training batch of this run."""

    def __init__(self, step):
        super().__init__()
        self.step, self.seen = step, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="multi_worker", choices=["multi_worker", "default"])
    parser.add_argument("--model", default="mpw", choices=["mpw", "hyperspherical"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--save-freq", default="epoch")
    parser.add_argument("--kill-at-step", type=int, default=None)
    parser.add_argument("--kill-worker", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    index = tf_config()["task"]["index"] if args.strategy == "multi_worker" else 0
    images, labels = dm.synthetic_data(args.count)
    callbacks = []
    if args.model == "hyperspherical":
        from ot_layers.callbacks import PrototypeReassignment

        build = dm.hyperspherical_training
        data = dm.dataset(images, labels, args.batch_size, inputs="images_labels")
        callbacks.append(PrototypeReassignment(batch_frequency=3))
    else:
        build = dm.mpw_classifier
        data = dm.dataset(images, labels, args.batch_size)
    if args.kill_at_step is not None and index == args.kill_worker:
        callbacks.append(SelfKill(args.kill_at_step))
    save_freq = args.save_freq if args.save_freq == "epoch" else int(args.save_freq)
    model, history = fit(build, data, epochs=args.epochs, strategy=strategy, callbacks=callbacks,
                         checkpoint_dir=args.checkpoint, save_freq=save_freq, verbose=0)
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"worker-{index}.npz"), **dm.weights_by_path(model))
    with open(os.path.join(args.out, f"worker-{index}.json"), "w") as handle:
        json.dump({"history": history.history, "replicas": strategy.num_replicas_in_sync}, handle)


if __name__ == "__main__":
    main()
