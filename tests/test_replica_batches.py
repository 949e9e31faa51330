"""A batch with fewer examples than a ``tf.distribute`` strategy's replicas leaves a replica an empty batch, on
which oneDNN's CPU convolution returns its input unchanged and the next convolution fails ("input depth must be
evenly divisible by filter depth: 1 vs 8"), deep inside ``fit`` (for the last validation batch: after the first
epoch's training). ``training.distributed.fit`` refuses such data before training, in one line naming it.
Under a 2-replica ``MirroredStrategy`` on the two logical CPU devices of ``conftest``."""
import numpy as np
import pytest
import tensorflow as tf

import distributed_models as dm
from otzoo.cli import USER_ERRORS
from training.distributed.fit import EmptyReplicaError, check_replica_batches, distributed_fit, fit
from training.distributed.strategies import make_strategy

IMAGES, LABELS = dm.synthetic_data(64)


def _batches(count, batch_size, start=0, drop_remainder=False):
    data = tf.data.Dataset.from_tensor_slices((IMAGES[start:start + count], LABELS[start:start + count]))
    return data.batch(batch_size, drop_remainder=drop_remainder)


def _mirrored_model():
    strategy = make_strategy("mirrored", ["/cpu:0", "/cpu:1"])
    with strategy.scope():
        return strategy, dm.mpw_classifier()


def _assert_untrained(model, before):
    assert int(model.optimizer.iterations.numpy()) == 0  # refused before any step
    for found, expected in zip(model.get_weights(), before):
        np.testing.assert_array_equal(found, expected)


@pytest.mark.parametrize("trainer", ["model_fit", "loop"])
def test_a_last_validation_batch_smaller_than_the_replicas_is_refused_before_training(trainer):
    """17 validation examples in batches of 16 end with a batch of 1 for 2 replicas: before, ``model.fit`` (and the
    loop) trained an epoch and then failed in the convolution with an ``InvalidArgumentError``."""
    strategy, model = _mirrored_model()
    before = model.get_weights()
    with pytest.raises(EmptyReplicaError) as raised:
        if trainer == "model_fit":
            fit(model, _batches(32, 16), epochs=1, validation_data=_batches(17, 16, start=32), verbose=0)
        else:
            distributed_fit(model, strategy, _batches(32, 16), 1, validation_data=_batches(17, 16, start=32),
                            verbose=0)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("`validation_data`: 17 examples in batches of 16 include a "
                                                      "batch of 1, fewer than the 2 replicas of strategy mirrored")
    assert isinstance(raised.value, USER_ERRORS)  # otzoo prints it in one line
    _assert_untrained(model, before)


def test_a_last_training_batch_smaller_than_the_replicas_is_refused_naming_batch_size():
    """33 training examples in batches of 16 (no drop_remainder) end with a batch of 1."""
    _, model = _mirrored_model()
    before = model.get_weights()
    with pytest.raises(EmptyReplicaError, match=r"^`data`: 33 examples in batches of 16 include a batch of 1, .*"
                                                r"otzoo train --batch-size"):
        fit(model, _batches(33, 16), epochs=1, verbose=0)
    _assert_untrained(model, before)


def test_batches_of_fewer_examples_than_replicas_are_refused_from_the_static_shape():
    """``drop_remainder=True`` batches of 1 for 2 replicas: every batch is too small, told by the shape alone."""
    strategy = make_strategy("mirrored", ["/cpu:0", "/cpu:1"])
    with pytest.raises(EmptyReplicaError, match=r"^`data`: batches of 1 example\(s\), .* take a batch size of at "
                                                r"least 2 \(otzoo train --batch-size\)"):
        check_replica_batches(strategy, _batches(4, 1, drop_remainder=True))


def test_batches_that_give_every_replica_an_example_are_accepted():
    """A last batch of at least one example per replica (uneven split included), validation steps stopping before
    the small batch, an endless dataset and one replica are not refused; a last batch of 3 trains."""
    strategy = make_strategy("mirrored", ["/cpu:0", "/cpu:1"])
    check_replica_batches(strategy, _batches(34, 16), _batches(19, 16))  # last batches of 2 and 3
    check_replica_batches(strategy, _batches(32, 16), _batches(17, 16), validation_steps=1)
    check_replica_batches(strategy, _batches(33, 16).repeat())  # endless: not read
    check_replica_batches(tf.distribute.get_strategy(), _batches(33, 16), _batches(17, 16))  # one replica

    _, model = _mirrored_model()
    _, history = fit(model, _batches(32, 16), epochs=1, validation_data=_batches(19, 16, start=32), verbose=0)
    assert np.isfinite(history.history["val_loss"][0])
