"""Deep metric learning losses as Keras losses (the baselines GSP is measured with, thesis ch. 3 and 5).

Every loss takes integer class labels ``y_true`` ``(B,)`` or ``(B, 1)`` and embeddings ``y_pred`` ``(B, d)``,
L2-normalizes the embeddings (unless ``normalize=False``; then distances and similarities are the raw Euclidean
distances and inner products) and returns the batch loss (a scalar). Pair-based losses use the pairs of the
(local, per-replica) batch; use them with a class-balanced batch sampler (``training.data.ClassBalancedBatches``).
Proxy losses (``ProxyNCAPlusPlusLoss``, ``ProxyAnchorLoss``) take instead the output of a ``ClassProxies`` layer
placed in the model: the cosine similarities ``(B, num_classes, num_proxies)`` of the normalized embeddings to the
normalized proxies. The proxies are that layer's weight (trained by ``model.fit``, re-initialized by callbacks
through the layer); the losses hold no reference to it.

Written in ``keras.ops``: the losses run on the TensorFlow, JAX and PyTorch backends. They compute in float32 (in
float64 for float64 input, e.g. a loss built with ``dtype="float64"``). Under a TensorFlow distribution strategy the
scalar batch loss is divided by the number of replicas (``ot_layers.losses.common.per_replica``); JAX and PyTorch
count one replica. Labels of the wrong shape (one-hot, or not one per row) fail with a ``ValueError`` naming ``y_true``,
a ``y_pred`` of the wrong rank one naming ``y_pred``; an empty batch (a replica's share of a last, short batch, say)
has loss 0. Non-finite embeddings give a non-finite loss (a diverged run does not read as loss 0).
"""
import keras
from keras import ops

from ot_layers.losses.common import (BatchLevelLoss, KeepsDType, check_prediction_shape, class_labels,
                                     is_empty_batch, per_replica, zero_loss)
from ot_layers.tensor_ops import as_compute_dtype, at_least, label_columns, normalize_rows
from ot_layers.validation import check_finite, check_flag, check_non_negative, check_positive

_NEG_INF = float("-inf")


def _normalized(x):
    """``x / max(||x||, 1e-6)`` per row (``tensor_ops.normalize_rows``, as ``tf.math.l2_normalize``)."""
    return normalize_rows(as_compute_dtype(x), axis=-1)


def _pair_masks(labels):
    """Boolean ``(B, B)`` masks of positive pairs (same class, ``i != j``) and negative pairs."""
    same = ops.equal(labels[:, None], labels[None, :])
    index = ops.arange(ops.shape(labels)[0], dtype="int32")
    not_self = ops.not_equal(index[:, None], index[None, :])
    return ops.logical_and(same, not_self), ops.logical_not(same)


def _inner_products(x):
    """``x x^T`` ``(B, B)`` (an einsum: TensorFlow's ``keras.ops.matmul`` needs a known rank)."""
    return ops.einsum("id,jd->ij", x, x)


def _distances(x):
    """Pairwise Euclidean distances ``(B, B)``, with a finite gradient at 0."""
    squared_norms = ops.sum(x * x, axis=-1)
    squared = squared_norms[:, None] + squared_norms[None, :] - 2.0 * _inner_products(x)
    return ops.sqrt(at_least(squared, 1e-12))


def _mean(values):
    """The mean of all of ``values``, as a sum over a count: Keras' ``ops.mean`` (3.15) computes float64 tensors in
    float32 on the JAX and PyTorch backends. 0 for no values."""
    return ops.sum(values) / at_least(ops.sum(ops.ones_like(values)), 1.0)


def _masked_mean(values, mask):
    mask = ops.cast(mask, values.dtype)
    return ops.sum(values * mask) / at_least(ops.sum(mask), 1.0)


def log_one_plus_sum_exp(logits, mask, axis):
    """``log(1 + sum_{mask} exp(logits))`` along ``axis``, stable, 0 with a zero gradient where the mask is empty."""
    masked = ops.where(mask, logits, ops.full_like(logits, _NEG_INF))
    shift = ops.stop_gradient(at_least(ops.max(masked, axis=axis, keepdims=True), 0.0))
    total = ops.exp(-shift) + ops.sum(ops.exp(masked - shift), axis=axis, keepdims=True)
    return ops.squeeze(shift + ops.log(total), axis=axis)


def sparse_cross_entropy(labels, logits):
    """Per-example softmax cross-entropy of integer ``labels`` ``(B,)`` against ``logits`` ``(B, C)``
    (``tf.nn.sparse_softmax_cross_entropy_with_logits`` on TensorFlow)."""
    return ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)


class _MetricLoss(BatchLevelLoss, KeepsDType, keras.losses.Loss):
    def __init__(self, name, normalize=True, reduction="sum_over_batch_size", **kwargs):
        super().__init__(name=name, reduction=reduction, **kwargs)
        self.normalize = check_flag("normalize", normalize)

    def call(self, y_true, y_pred):
        check_prediction_shape(self, y_pred, 2, "embeddings of shape (B, d)")
        labels = class_labels(self, y_true, y_pred)
        x = _normalized(y_pred) if self.normalize else as_compute_dtype(y_pred)
        if is_empty_batch(x):
            return zero_loss(x)
        return per_replica(self.batch_loss(labels, x))

    def get_config(self):
        return {**super().get_config(), "normalize": self.normalize}


@keras.saving.register_keras_serializable(package="ot_layers")
class ContrastiveLoss(_MetricLoss):
    """Contrastive loss with a positive margin (C2): with ``d`` the distance between normalized embeddings,

    ``L = mean_{pos} [d - m+]_+ + mean_{neg} [m- - d]_+``.
    Defaults ``(m+, m-) = (0.2652, 0.5409)``: the C2 setting on Cars196 of Gurbuz 2022 (ch. 3,
    Sec. 3.3.2.1).
    """

    def __init__(self, pos_margin=0.2652, neg_margin=0.5409, name="contrastive_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pos_margin = check_non_negative("pos_margin", pos_margin)
        self.neg_margin = check_positive("neg_margin", neg_margin)

    def batch_loss(self, labels, x):
        positive, negative = _pair_masks(labels)
        d = _distances(x)
        return (_masked_mean(ops.relu(d - self.pos_margin), positive)
                + _masked_mean(ops.relu(self.neg_margin - d), negative))

    def get_config(self):
        return {**super().get_config(), "pos_margin": self.pos_margin, "neg_margin": self.neg_margin}


@keras.saving.register_keras_serializable(package="ot_layers")
class TripletLoss(_MetricLoss):
    """Triplet loss over all valid triplets of the batch: ``[d(a, p) - d(a, n) + margin]_+``,

    averaged over the triplets with a positive loss (batch-all; 0 when none is active).
    """

    def __init__(self, margin=0.1, name="triplet_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.margin = check_positive("margin", margin)

    def batch_loss(self, labels, x):
        positive, negative = _pair_masks(labels)
        d = _distances(x)
        valid = ops.logical_and(positive[:, :, None], negative[:, None, :])  # (anchor, positive, negative)
        losses = ops.relu(d[:, :, None] - d[:, None, :] + self.margin)
        return _masked_mean(losses, ops.logical_and(valid, losses > 0.0))

    def get_config(self):
        return {**super().get_config(), "margin": self.margin}


@keras.saving.register_keras_serializable(package="ot_layers")
class MultiSimilarityLoss(_MetricLoss):
    """Multi-similarity loss (Wang et al. 2019) with its pair mining, on cosine similarities ``S``:

    keep positives with ``S_ip < max_neg S_in + mining_margin`` and negatives with
    ``S_in > min_pos S_ip - mining_margin``;
    ``L = mean_i [ (1/alpha) log(1 + sum_P exp(-alpha (S_ip - base)))
                 + (1/beta) log(1 + sum_N exp(beta (S_in - base))) ]``.
    A non-finite embedding gives a NaN loss (its NaN similarities would otherwise fail every mining comparison and
    drop out of the loss: all-NaN embeddings gave 0).
    """

    def __init__(self, alpha=2.0, beta=50.0, base=0.5, mining_margin=0.1, name="multi_similarity_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.alpha = check_positive("alpha", alpha)
        self.beta = check_positive("beta", beta)
        self.base = check_finite("base", base)
        self.mining_margin = check_non_negative("mining_margin", mining_margin)

    def batch_loss(self, labels, x):
        positive, negative = _pair_masks(labels)
        s = _inner_products(x)
        hardest_negative = ops.max(ops.where(negative, s, ops.full_like(s, _NEG_INF)), axis=1, keepdims=True)
        hardest_positive = ops.min(ops.where(positive, s, ops.full_like(s, float("inf"))), axis=1, keepdims=True)
        mined_positive = ops.logical_and(positive, s - self.mining_margin < hardest_negative)
        mined_negative = ops.logical_and(negative, s + self.mining_margin > hardest_positive)
        pos_term = log_one_plus_sum_exp(-self.alpha * (s - self.base), mined_positive, axis=1) / self.alpha
        neg_term = log_one_plus_sum_exp(self.beta * (s - self.base), mined_negative, axis=1) / self.beta
        per_anchor = pos_term + neg_term
        # NaN where a row of similarities is not finite: by selection, not `+ 0 * sum(s)`, which TensorFlow's graph
        # optimizer may fold to `+ 0`; the value and gradient on finite input are unchanged
        finite = ops.all(ops.isfinite(s), axis=1)
        return _mean(ops.where(finite, per_anchor, ops.full_like(per_anchor, float("nan"))))

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha, "beta": self.beta, "base": self.base,
                "mining_margin": self.mining_margin}


class ProxyLoss(BatchLevelLoss, KeepsDType, keras.losses.Loss):
    """Base of losses on the output of a ``ClassProxies`` layer (``output="similarities"``): ``y_pred`` holds the
    cosine similarities ``(B, num_classes, num_proxies)`` of the normalized embeddings to the normalized proxies,
    ``y_true`` the integer labels ``(B,)`` or ``(B, 1)``. The loss holds no reference to the layer: it is a plain
    function of ``(y_true, y_pred)``, so a compiled model survives a ``.keras`` round trip."""

    min_classes = 1  # the fewest classes (``y_pred.shape[1]``) the loss takes

    def __init__(self, name, reduction="sum_over_batch_size", **kwargs):
        super().__init__(name=name, reduction=reduction, **kwargs)

    def call(self, y_true, y_pred):
        similarity = as_compute_dtype(y_pred)
        check_prediction_shape(self, similarity, 3, "the (B, num_classes, num_proxies) similarities of a "
                               "ClassProxies layer", self.min_classes, f"num_classes >= {self.min_classes}")
        labels = class_labels(self, y_true, similarity)
        if is_empty_batch(similarity):
            return zero_loss(similarity)
        return per_replica(self.batch_loss(labels, similarity))


@keras.saving.register_keras_serializable(package="ot_layers")
class ProxyNCAPlusPlusLoss(ProxyLoss):
    """ProxyNCA++ (Teh et al. 2020): softmax cross-entropy over classes of ``-||x̂ - p̂_c||^2 / temperature``

    with normalized embeddings and proxies, ``||x̂ - p̂||^2 = 2 - 2 s``; with several proxies per class, class ``c``
    is represented by its nearest proxy. ``temperature`` divides (0.1 as in the thesis, ch. 3). The loss is the mean
    over the batch of the samples' cross-entropies; a sample whose label is outside ``0..num_classes-1`` (-1 for an
    unlabelled sample, say) contributes zero, alike on every backend (as in ``ManifoldProxyLoss`` and
    ``HypersphericalPullLoss``). Takes ``num_classes >= 2`` (over one class the cross-entropy is 0).
    """

    min_classes = 2

    def __init__(self, temperature=0.1, name="proxy_nca_pp_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.temperature = check_positive("temperature", temperature)

    def batch_loss(self, labels, similarity):
        squared_distance = 2.0 - 2.0 * ops.max(similarity, axis=-1)  # nearest proxy of each class
        logits = -squared_distance / self.temperature
        known = ops.any(label_columns(labels, ops.shape(logits)[1]), axis=1)
        # an unknown label is replaced by 0 before the cross-entropy (its gather raised on TensorFlow's CPU and gave
        # NaN on a GPU), and its term by 0 after
        ce = sparse_cross_entropy(ops.where(known, labels, ops.zeros_like(labels)), logits)
        return _mean(ops.where(known, ce, ops.zeros_like(ce)))

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature}


@keras.saving.register_keras_serializable(package="ot_layers")
class ProxyAnchorLoss(ProxyLoss):
    """Proxy-Anchor loss (Kim et al. 2020) with every proxy labelled by its class, cosine similarity ``s``:

    ``L = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (s(x,p) - delta)))
        + 1/|P| sum_{p in P} log(1 + sum_{x in X_p-} exp(alpha (s(x,p) + delta)))``,
    ``P+`` the proxies with a positive in the batch. Defaults ``(delta, alpha) = (0.1, 32)`` (thesis ch. 3).
    """

    def __init__(self, margin=0.1, alpha=32.0, name="proxy_anchor_loss", **kwargs):
        super().__init__(name=name, **kwargs)
        self.margin = check_non_negative("margin", margin)
        self.alpha = check_positive("alpha", alpha)

    def batch_loss(self, labels, similarity):
        num_classes, per_class = similarity.shape[1], similarity.shape[2]
        s = ops.reshape(similarity, (-1, num_classes * per_class))  # (B, P)
        proxy_labels = ops.repeat(ops.arange(num_classes, dtype="int32"), per_class)
        positive = ops.equal(labels[:, None], proxy_labels[None, :])
        pos_term = log_one_plus_sum_exp(-self.alpha * (s - self.margin), positive, axis=0)
        neg_term = log_one_plus_sum_exp(self.alpha * (s + self.margin), ops.logical_not(positive), axis=0)
        has_positive = ops.any(positive, axis=0)
        return _masked_mean(pos_term, has_positive) + _mean(neg_term)

    def get_config(self):
        return {**super().get_config(), "margin": self.margin, "alpha": self.alpha}
