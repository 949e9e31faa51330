"""Every head of the zoo trains under a 2-replica ``MirroredStrategy`` (two logical CPUs, ``conftest.py``) with its
state callbacks, through ``training.fit``: each variable's two replica copies stay identical, and the variables
equal those of a one-replica run (``strategy="one_device"``) of the same global batches.

The backbone has no BatchNorm and the transport solvers run a fixed number of iterations
(``tests/distributed_models.py``), so two replicas of half a batch compute the one-replica step exactly, up to
float32 rounding. One variable is compared loosely: the hyperspherical head's class representatives are a
``mean``-aggregated moving average -- each replica moves them towards its own half batch's class means and the
replicas average the results -- which is not the one-replica update on the whole batch. So the head's ``PrototypeReassignment`` runs once per
epoch (the paper's schedule): both runs then take the same re-assignment decisions (checked: the assignments are
compared exactly) and everything else stays equal. (Re-assigning every few batches from representatives that
have only seen one or two batches can decide differently in the two runs, and the runs then part ways.)

The GSP prototypes (and their momenta) are compared at 3e-4 (measured: 1e-4 after 4 steps, growing from 1e-5 after
the first): ``GSPPrototypeInit`` sets them to local features that ``predict`` computes with the weights of the first
(warm-up) epoch, which the two runs share only up to float32 rounding, so a prototype sits within rounding (1e-7) of
the same feature inside the training step, where the direction of ``u - p`` -- the gradient of the distance cost --
is rounding noise; the gradients are otherwise the same (checked: the mean of the half-batch gradients equals the
whole-batch gradient to 3e-9).

The proxy models train with :class:`PerExampleProxyNCA`, ProxyNCA++ returning one value per example. The
package's ``ProxyNCAPlusPlusLoss`` (like every ``ProxyLoss`` and pair loss) returns the batch mean as a scalar, and
Keras 3.15 divides a loss by the number of replicas only when it reduces a non-scalar
(``keras/src/losses/loss.py::reduce_values`` returns a scalar untouched); the losses divide their scalar by the
number of replicas themselves, which ``test_scalar_proxy_loss_is_divided_by_the_replicas`` checks against the
one-replica run (it failed before that fix: gradients N times too large).
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

import distributed_models as dm
import zoo
from ot_layers.callbacks import CCPReinitialization, GSPPrototypeInit, PrototypeReassignment
from ot_layers.losses import ProxyNCAPlusPlusLoss
from training.distributed.fit import fit

EPOCHS, BATCH = 2, 16


def _classifier(head, **head_kwargs):
    def build():
        keras.utils.set_random_seed(0)
        model = zoo.image_classifier(dm.plain_backbone(), head, dm.NUM_CLASSES, input_shape=dm.IMAGE_SHAPE,
                                     head_kwargs=head_kwargs)
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model
    return build


class PerExampleProxyNCA(ProxyNCAPlusPlusLoss):
    """``ProxyNCAPlusPlusLoss`` returning the per-example cross-entropies (their mean is that loss), so Keras
    reduces it over the batch and the replicas itself."""

    def batch_loss(self, labels, similarity):
        logits = -(2.0 - 2.0 * tf.reduce_max(similarity, axis=-1)) / self.temperature
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)


def _proxy_model(pooling, loss=PerExampleProxyNCA, **pooling_kwargs):
    def build():
        keras.utils.set_random_seed(0)
        embed = zoo.embedding_model(dm.plain_backbone(), pooling, embedding_dim=8, input_shape=dm.IMAGE_SHAPE,
                                    pooling_kwargs=pooling_kwargs or None)
        model = zoo.proxy_training_model(embed, dm.NUM_CLASSES, num_proxies=2)
        model.compile(keras.optimizers.SGD(0.05, momentum=0.9), loss())
        return model
    return build


def _scripted_scores():
    scores = iter([0.5, 0.4, 0.3, 0.2])  # never improves after the first epoch: CCP re-initializes every epoch
    return lambda: next(scores)


def _case(name):
    images, labels = dm.synthetic_data(64)
    data = dm.dataset(images, labels, BATCH)
    if name == "gap_fc":
        return _classifier("gap_fc"), data, list
    if name == "mpw":
        return dm.mpw_classifier, data, list
    if name == "hyperspherical":
        return (dm.hyperspherical_training, dm.dataset(images, labels, BATCH, inputs="images_labels"),
                lambda: [PrototypeReassignment()])  # once per epoch (the paper); see the docstring
    if name == "proxies_scalar_loss":
        return _proxy_model("gap", loss=ProxyNCAPlusPlusLoss), data, list
    if name == "proxies_ccp":
        return _proxy_model("gap"), data, lambda: [CCPReinitialization(
            images, labels, _scripted_scores(), patience=1, pool_size=4, restore_best_weights=False)]
    return (_proxy_model("gsp", num_prototypes=4, epsilon=2.0, threshold=0.0, max_iter=10), data,
            lambda: [GSPPrototypeInit(images, warmup_epochs=1, num_features=64)])


def _replica_copies_identical(model, strategy):
    for weight in model.weights:
        copies = strategy.experimental_local_results(weight.value)
        assert len(copies) == 2, weight.path
        np.testing.assert_array_equal(np.asarray(copies[0]), np.asarray(copies[1]), err_msg=weight.path)


def _train_and_compare(head):
    build, data, callbacks = _case(head)
    mirrored, _ = fit(build, data, epochs=EPOCHS, strategy="mirrored", callbacks=callbacks(), verbose=0)
    strategy = mirrored.distribute_strategy
    assert isinstance(strategy, tf.distribute.MirroredStrategy) and strategy.num_replicas_in_sync == 2
    _replica_copies_identical(mirrored, strategy)
    single, _ = fit(build, data, epochs=EPOCHS, strategy="one_device", callbacks=callbacks(), verbose=0)
    assert single.distribute_strategy.num_replicas_in_sync == 1

    found, expected = dm.weights_by_path(mirrored), dm.weights_by_path(single)
    assert sorted(found) == sorted(expected)
    initial = dm.weights_by_path(build())
    for key in expected:
        if key.endswith("representatives"):  # see the module docstring: same direction, not the same average
            cosine = np.sum(found[key] * expected[key], axis=-1)
            assert np.all(cosine > 0.98), (key, cosine)  # measured: 0.987 for the least similar class
            continue
        atol = 3e-4 if key.endswith(("gsp/prototypes", "gsp_prototypes_momentum")) else 1e-5  # module docstring
        np.testing.assert_allclose(found[key], expected[key], rtol=0, atol=atol, err_msg=key)
    changed = [k for k in initial if k in expected and k.startswith("model/")
               and not np.allclose(initial[k], expected[k])]
    assert changed  # the runs trained (and the state callbacks acted, checked below)
    if head == "proxies_ccp":
        assert float(np.asarray(single.ccp_state.reinitializations)) == 1.0
    if head == "gsp":
        assert float(np.asarray(single.get_layer("gsp").prototypes_initialized)) == 1.0


@pytest.mark.parametrize("head", ["gap_fc", "mpw", "hyperspherical", "proxies_ccp", "gsp"])
def test_head_trains_under_two_replica_mirrored_strategy(head):
    _train_and_compare(head)


def test_scalar_proxy_loss_is_divided_by_the_replicas():
    _train_and_compare("proxies_scalar_loss")
