"""GSP's cross-batch zero-shot prediction loss ``L_ZS`` (Gurbuz 2022 thesis, Sec. 5.2.3, Eq. 5.2.4).

Given pseudo-attributes ``z_i`` (``GeneralizedSumPooling(return_attributes=True)``) and learnable class
embeddings ``Upsilon = [v_c]``, the batch is split into halves ``b1``, ``b2`` with disjoint classes. On each half a
ridge map is fitted in closed form (P3): ``A_b = Upsilon_b (Z_b^T Z_b + eps I)^{-1} Z_b^T`` (``Z_b`` has the
``z_i`` as columns, ``Upsilon_b`` the ``v_{y_i}``), so that ``A_b z ~ v_y``; the other half's samples are then
classified over all classes with logits ``scale * v_j^T A z_i``:

    L_ZS = mean_{i in b2} CE(y_i, [s v_j^T A_1 z_i]_j) + mean_{i in b1} CE(y_i, [s v_j^T A_2 z_i]_j).

Combine with a metric-learning loss as ``(1 - lambda) L_DML + lambda L_ZS`` (Eq. 5.2.5, ``lambda = 0.1``):
``model.compile(loss=[dml_loss, zero_shot_loss], loss_weights=[1 - lambda, lambda])`` for a model whose outputs
are ``[ClassProxies(...)(embedding), ClassProxies(num_classes, dim=dv, output="packed")(z)]``.

Under a distribution strategy each replica computes ``L_ZS`` on its own share of the batch (halves, ridge maps and
predictions within that share), and the loss divides that scalar by the number of replicas (as the metric-learning
losses do), so the summed replica gradients are the mean of the per-replica ``L_ZS`` gradients.

Written in ``keras.ops``: runs on the TensorFlow, JAX and PyTorch backends (``tf.distribute`` is TensorFlow's; JAX
and PyTorch count one replica). Computes in float32; in float64 for a loss built with ``dtype="float64"`` (Keras casts
``y_pred`` to the loss's dtype, so float64 input alone is computed in float32), as the metric-learning losses do.
"""
import keras
from keras import ops

from ot_layers.losses.common import (BatchLevelLoss, KeepsDType, check_prediction_shape, class_labels,
                                     is_empty_batch, per_replica, zero_loss)
from ot_layers.losses.metric_learning import sparse_cross_entropy
from ot_layers.tensor_ops import as_compute_dtype, at_least, label_columns
from ot_layers.validation import check_positive

ZERO_SHOT_WEIGHT = 0.1  # lambda of Eq. 5.2.5


_NO_LABEL = 2 ** 31 - 1  # sorts after every class label


def disjoint_class_halves(labels, known=None):
    """Boolean mask of the first half ``b1``: the samples of the lower half of the batch's distinct classes (those
    whose label ranks below ``D // 2`` among the ``D`` distinct labels).

    All samples of a class fall on the same side, so the halves have disjoint classes, and both are non-empty
    whenever the batch holds two classes or more, however unevenly its samples spread over them (a split at the
    median *sample* left ``b1`` empty when the lowest class held half the batch, and the loss then had no
    gradient); with a class-balanced batch (P classes x K samples) ``b1`` holds the lower P // 2 classes. XLA-friendly
    (one sort, no ``unique``). ``known`` (boolean ``(B,)``, all true if omitted) marks the samples taken: the classes
    counted are theirs, and the others are in neither half (in ``b1`` never, and to be left out of ``b2`` by the
    caller).
    """
    if known is None:
        keyed, count = labels, ops.shape(labels)[0]
    else:
        keyed = ops.where(known, labels, ops.full_like(labels, _NO_LABEL))
        count = ops.sum(ops.cast(known, "int32"))
    ordered = ops.sort(keyed)
    taken = ops.arange(ops.shape(ordered)[0]) < count
    previous = ops.concatenate([ordered[:1] - 1, ordered[:-1]])  # the first sorted label starts a class
    starts = ops.logical_and(ordered != previous, taken)
    rank = ops.cumsum(ops.cast(starts, "int32")) - 1  # of each sorted sample's class among the distinct ones
    middle = ops.sum(ops.cast(starts, "int32")) // 2
    candidates = ops.where(ops.logical_and(rank == middle, taken), ordered, ops.full_like(ordered, _NO_LABEL))
    # padded with one entry so that an empty batch (traced with an unknown size) takes a minimum of something
    threshold = ops.min(ops.concatenate([candidates, ops.full((1,), _NO_LABEL, dtype=ordered.dtype)]))
    first = labels < threshold
    return first if known is None else ops.logical_and(first, known)


def _ridge_map(z, targets, mask, ridge):
    """``A = Upsilon_b (Z_b^T Z_b + eps I)^{-1} Z_b^T`` ``(dv, m)`` fitted on the masked samples only."""
    weight = ops.cast(mask, z.dtype)[:, None]
    z_b, v_b = z * weight, targets * weight  # zeroed rows drop out of the fit exactly
    gram = ops.einsum("id,jd->ij", z_b, z_b) + ridge * ops.eye(ops.shape(z)[0], dtype=z.dtype)
    return ops.einsum("ik,id->kd", v_b, ops.solve(gram, z_b))


@keras.saving.register_keras_serializable(package="ot_layers")
class ZeroShotPredictionLoss(BatchLevelLoss, KeepsDType, keras.losses.Loss):
    """``L_ZS`` of Eq. 5.2.4 with integer labels ``y_true`` ``(B,)`` and ``y_pred`` the packed output of a
    ``ClassProxies(num_classes, dim=dv, output="packed")`` layer applied to the pseudo-attributes ``z``:
    ``(B, 1 + num_classes, D)``, row 0 ``z_i`` and rows ``1..num_classes`` the class embeddings ``Upsilon`` (the
    layer's weight, trained by ``model.fit``), zero-padded to a common width ``D`` (padding changes no inner
    product, and the loss depends on ``z`` and ``Upsilon`` only through inner products). The loss holds no layer
    reference. ``ridge``: ``eps`` of (P3), 0.05; ``scale``: the logit multiplier, 9.5 as used by the authors.

    A sample whose label is outside ``0..num_classes-1`` (-1 for an unlabelled sample, say) contributes zero, alike
    on every backend (as in ``ManifoldProxyLoss`` and ``HypersphericalPullLoss``): it is in neither half, so neither
    fits a ridge map nor is classified, and each half's mean runs over its labelled samples. ``y_pred`` must hold at
    least two classes (``num_classes >= 2``: over one class the cross-entropy is 0).
    """

    def __init__(self, ridge=0.05, scale=9.5, name="zero_shot_loss", reduction="sum_over_batch_size", **kwargs):
        super().__init__(name=name, reduction=reduction, **kwargs)
        self.ridge = check_positive("ridge", ridge)
        self.scale = check_positive("scale", scale)

    def call(self, y_true, y_pred):
        packed = as_compute_dtype(y_pred)
        check_prediction_shape(self, packed, 3, "the (B, 1 + num_classes, D) output of ClassProxies(..., "
                               "output='packed')", 3, "num_classes >= 2")
        labels = class_labels(self, y_true, packed)
        if is_empty_batch(packed):
            return zero_loss(packed)
        z = packed[:, 0, :]
        upsilon = ops.sum(packed[:1, 1:, :], axis=0)  # (c, D), the same in every row (zeros for an empty batch)
        known = ops.any(label_columns(labels, ops.shape(upsilon)[0]), axis=1)
        # an unknown label is replaced by 0 for the gather and the cross-entropy (TensorFlow's CPU raised, its GPU
        # gather gave zeros); such a sample is in neither half, so neither its target nor its term is used
        safe_labels = ops.where(known, labels, ops.zeros_like(labels))
        targets = ops.take(upsilon, safe_labels, axis=0)
        first = disjoint_class_halves(labels, known)
        second = ops.logical_and(ops.logical_not(first), known)
        total = 0.0
        for fit_on, evaluate_on in ((first, second), (second, first)):
            predictor = _ridge_map(z, targets, fit_on, self.ridge)  # (dv, m)
            logits = self.scale * ops.einsum("jd,cd->jc", ops.einsum("id,kd->ik", z, predictor), upsilon)
            ce = sparse_cross_entropy(safe_labels, logits)
            weight = ops.cast(evaluate_on, ce.dtype)
            total += ops.sum(ce * weight) / at_least(ops.sum(weight), 1.0)
        # A scalar batch loss: Keras sums the replicas' gradients without dividing a scalar by the replicas.
        return per_replica(total)

    def get_config(self):
        return {**super().get_config(), "ridge": self.ridge, "scale": self.scale}
