"""Random-walk manifold similarity of a small point set (EDMS, paper 002, Sec. 5, eq. 9; SPEC S7).

For points ``x_1..x_n`` (a mini-batch plus the proxies): non-negative affinities ``S_ij = exp(x_i . x_j / tau)``
with a zero diagonal, ``S_bar = D^{-1/2} S D^{-1/2}`` (``D`` the row sums), and the closed-form limit of the
random walk with restart probability ``1 - alpha``:

    F = (1 - alpha) (I - alpha S_bar)^{-1},        (eq. 9; column n of F is F_n for the query e_n)

the fixed point of ``F <- alpha S_bar F + (1 - alpha) I``. ``F`` is symmetric; ``F_ij`` is the manifold similarity
of ``x_i`` and ``x_j``. Differentiable (TensorFlow ops); leading batch axes are allowed.
"""
import tensorflow as tf

from ot_layers.validation import check_in_range, check_positive


def random_walk_similarity(points, alpha=0.8, temperature=0.5):
    """Manifold similarity matrix ``F`` ``(..., n, n)`` of ``points`` ``(..., n, d)`` (float32)."""
    alpha = float(check_in_range("alpha", alpha, 0.0, 1.0, low_open=True, high_open=True))
    temperature = float(check_positive("temperature", temperature))
    x = tf.convert_to_tensor(points)
    if x.shape.rank is not None and x.shape.rank < 2:
        raise ValueError(f"`points` must have shape (..., n, d), got {x.shape}.")
    x = tf.cast(x, tf.float32)
    n = tf.shape(x)[-2]
    affinity = tf.exp(tf.matmul(x, x, transpose_b=True) / temperature)
    affinity = tf.linalg.set_diag(affinity, tf.zeros(tf.shape(affinity)[:-1], tf.float32))
    inv_sqrt_degree = tf.math.rsqrt(tf.reduce_sum(affinity, axis=-1))
    normalized = affinity * inv_sqrt_degree[..., :, None] * inv_sqrt_degree[..., None, :]
    eye = tf.eye(n, dtype=tf.float32)
    return (1.0 - alpha) * tf.linalg.inv(eye - alpha * normalized)
