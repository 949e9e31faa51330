"""GSP's partial transport (Gurbuz 2022 thesis, Prop. 5.2.1) stops each problem at its own threshold: a problem solved
in a batch with a slow-converging one ends exactly where it ends solved alone, so a ``GeneralizedSumPooling``
embedding does not depend on the rest of its batch (eagerly, in a graph and under XLA, with both gradient modes and
both methods).

Before the fix the loop ran until the batch's largest error met the threshold: with Prop. 5.2.1's update, the easy
problem below (14 iterations alone) ran the hard one's 760, and its plan moved by ~1e-5 relative to its lone
solution. Newton's method needs 4 and 8 evaluations for them.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

from ot_layers import GeneralizedSumPooling
from ot_layers.solvers import partial_transport
from ot_layers.solvers.partial_transport import GRADIENTS, METHODS

SOLVER = {"transport_ratio": 0.3, "epsilon": 0.01, "max_iter": 5000, "threshold": 1e-4}


def _easy_and_hard():
    """Two ``(4, 10)`` costs: a flat one (14 updates of Prop. 5.2.1 to 1e-4, 4 Newton evaluations) and a sharp one
    (760 updates, 8 evaluations)."""
    easy = 0.1 * np.random.default_rng(0).uniform(0.0, 1.0, size=(4, 10))
    hard = np.random.default_rng(23).uniform(0.0, 2.0, size=(4, 10))
    return easy, hard


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
@pytest.mark.parametrize("gradient", GRADIENTS)
def test_problem_in_a_batch_with_a_slow_problem_equals_the_problem_solved_alone(gradient, dtype, method):
    easy, hard = _easy_and_hard()
    solve = tf.function(lambda c: partial_transport(c, gradient=gradient, method=method, **SOLVER))
    alone = {name: solve(tf.constant(c[None], dtype)) for name, c in (("easy", easy), ("hard", hard))}
    batch = solve(tf.constant(np.stack([easy, hard, easy]), dtype))
    lone_iterations = {name: _count(result.iterations) for name, result in alone.items()}
    slow = 500 if method == "fixed_point" else lone_iterations["easy"]
    assert lone_iterations["easy"] < 50 and slow < lone_iterations["hard"] < SOLVER["max_iter"]
    for index, name in ((0, "easy"), (1, "hard"), (2, "easy")):
        reference = alone[name]
        for field in ("plan", "residual", "scale"):
            np.testing.assert_allclose(getattr(batch, field).numpy()[index], getattr(reference, field).numpy()[0],
                                       rtol=1e-6, atol=0, err_msg=f"{name} {field}")
        # the error mu |t_prev / t - 1| cancels: float32 rounding of t shows in its last digits
        np.testing.assert_allclose(batch.error[index], reference.error[0], rtol=0, atol=1e-3 * SOLVER["threshold"])
        assert float(batch.error[index]) <= SOLVER["threshold"]
    # each problem reports the iterations it ran, the count it reports solved alone
    np.testing.assert_array_equal(batch.iterations.numpy(),
                                  [lone_iterations["easy"], lone_iterations["hard"], lone_iterations["easy"]])


def _count(iterations):
    """The iteration count of a one-problem batch."""
    return int(np.reshape(iterations.numpy(), -1)[0])


def test_gradients_of_a_problem_do_not_depend_on_its_batch():
    easy, hard = _easy_and_hard()
    weights = tf.constant(np.random.default_rng(1).normal(size=(4, 10)))

    @tf.function
    def gradient_of_first(cost, mode):
        with tf.GradientTape() as tape:
            tape.watch(cost)
            result = partial_transport(cost, gradient=mode, **SOLVER)
            value = tf.reduce_sum(result.plan[0] * weights) + tf.reduce_sum(tf.sin(9.0 * result.residual[0]))
        return tape.gradient(value, cost)[0]

    for mode in GRADIENTS:  # (Newton's method: the hard problem runs 4 evaluations past the easy one's)
        alone = gradient_of_first(tf.constant(easy[None]), mode).numpy()
        batched = gradient_of_first(tf.constant(np.stack([easy, hard])), mode).numpy()
        assert np.abs(alone).max() > 1e-3
        np.testing.assert_allclose(batched, alone, rtol=1e-9, atol=1e-12 * np.abs(alone).max(), err_msg=mode)


def _images():
    """A flat image (every element the same feature: converges at once) and two textured ones (slower)."""
    rng = np.random.default_rng(4)
    flat = np.broadcast_to(rng.normal(size=(1, 1, 3)), (4, 4, 3))
    textured = [rng.normal(size=(4, 4, 3)) * scale for scale in (0.3, 1.0)]
    return np.stack([flat, *textured]).astype(np.float32)


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("gradient", GRADIENTS)
def test_gsp_embedding_of_an_image_does_not_depend_on_its_batch(gradient, jit_compile):
    keras.utils.set_random_seed(3)
    layer = GeneralizedSumPooling(num_prototypes=4, epsilon=0.01, max_iter=3000, threshold=1e-4, gradient=gradient,
                                  return_attributes=True)
    images = _images()
    layer.build(images.shape)
    call = tf.function(lambda x: layer(x), jit_compile=jit_compile)
    iterations = [_count(partial_transport(cost, **_layer_solver(layer)).iterations) for cost in _costs(layer, images)]
    assert iterations[0] < 3 and min(iterations[1:]) > 2 * iterations[0]  # converge at different speeds
    pooled, attributes = (t.numpy() for t in call(images))
    for i in range(len(images)):
        pooled_alone, attributes_alone = (t.numpy() for t in call(images[i:i + 1]))
        np.testing.assert_allclose(pooled[i], pooled_alone[0], rtol=1e-5, atol=1e-7, err_msg=f"image {i}")
        np.testing.assert_allclose(attributes[i], attributes_alone[0], rtol=1e-5, atol=1e-7, err_msg=f"image {i}")
    # the order of the batch does not matter either
    reversed_pooled = call(images[::-1])[0].numpy()[::-1]
    np.testing.assert_allclose(reversed_pooled, pooled, rtol=1e-5, atol=1e-7)


def _layer_solver(layer):
    return {"transport_ratio": layer.transport_ratio, "epsilon": layer.epsilon, "max_iter": layer.max_iter,
            "threshold": layer.threshold}


def _costs(layer, images):
    """The layer's per-image costs ``(1, m, n)`` (as ``GeneralizedSumPooling.pooling_weights`` builds them)."""
    from ot_layers.layers.generalized_sum_pooling import _clip_norm, _euclidean_cost

    features = tf.reshape(tf.constant(images), [len(images), -1, images.shape[-1]])
    cost = _euclidean_cost(_clip_norm(layer.prototypes), _clip_norm(features))
    return [cost[i:i + 1] for i in range(len(images))]
