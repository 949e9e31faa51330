"""Finite-difference checks of gradients shared by the solver and layer tests."""
import numpy as np


def assert_directional_derivatives(value, x, gradient, rng, count=3, h=1e-6, rtol=1e-5, atol=1e-8):
    """Central differences of ``value`` (an array -> scalar function) at ``x`` along ``count`` random directions
    equal the directional derivatives ``<gradient, direction>`` of the analytic ``gradient``."""
    x = np.asarray(x)
    gradient = np.asarray(gradient)
    for _ in range(count):
        direction = rng.normal(size=x.shape)
        numeric = (float(value(x + h * direction)) - float(value(x - h * direction))) / (2 * h)
        np.testing.assert_allclose(np.sum(gradient * direction), numeric, rtol=rtol, atol=atol)


def run_with_a_bad_sample(call, loss, x, labels, bad_index, bad_value):
    """Outputs and input gradients of ``call`` on ``x`` with ``x[bad_index, 0] = bad_value`` (NaN or Inf) and on
    ``x`` without that sample, for checking that a bad value stays in its sample.

    ``loss(labels, outputs)`` gives per-sample losses; the bad run's loss sums the other samples only. Returns
    ``(keep, out_bad, out_keep, grad_bad, grad_keep)`` (``keep``: the indices of the other samples).
    """
    import tensorflow as tf

    bad = np.array(x, copy=True)
    bad[bad_index, 0] = bad_value
    keep = [i for i in range(len(x)) if i != bad_index]
    tb, tk = tf.Variable(bad), tf.Variable(np.asarray(x)[keep])
    with tf.GradientTape(persistent=True) as tape:
        out_bad, out_keep = call(tb), call(tk)
        loss_bad = tf.reduce_sum(tf.gather(loss(labels, out_bad), keep))
        loss_keep = tf.reduce_sum(loss(labels[keep], out_keep))
    return (keep, np.asarray(out_bad), np.asarray(out_keep), np.asarray(tape.gradient(loss_bad, tb)),
            np.asarray(tape.gradient(loss_keep, tk)))
