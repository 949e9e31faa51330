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
