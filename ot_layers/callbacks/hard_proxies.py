"""HardProxyUpdate: per-epoch (hard) meta-class proxies for EDMS (Aziere and Todorovic 2019, Sec. 4)."""
import keras
import numpy as np

from ot_layers.callbacks.ccp import model_strategy_scope
from ot_layers.layers.manifold_proxies import ManifoldProxies
from ot_layers.padded_predict import predict_padded
from ot_layers.tensor_ops import find_layer, normalize_rows_np
from ot_layers.validation import (check_embedding_width, check_fits_model_inputs, check_flag, check_image_array,
                                  check_labels, check_model_embedding_width, check_non_negative, check_positive,
                                  check_positive_int, check_seed)


def hard_proxy_objective(proxy, anchor, members):
    """``J(p) = log(1 + sum_n exp(p.x_n - p.p_k))`` (Aziere and Todorovic 2019, eq. 7) and its gradient
    ``sum_n w_n (x_n - p_k)`` with ``w_n = exp(a_n) / (1 + sum exp(a))``, ``a_n = p.(x_n - p_k)``."""
    diff = np.asarray(members, np.float64) - np.asarray(anchor, np.float64)[None, :]
    a = diff @ np.asarray(proxy, np.float64)
    shift = max(a.max(initial=0.0), 0.0)
    e = np.exp(a - shift)
    denominator = np.exp(-shift) + e.sum()
    return float(np.log(denominator) + shift), (e / denominator) @ diff


def harden_proxy(anchor, members, max_iter=100, learning_rate=1e-3, threshold=0.0):
    """``p*_k``: up to ``max_iter`` projected gradient-descent steps on ``J`` from ``p = p_k`` (eq. 7), stopping
    early when a step moves ``p`` by at most ``threshold`` (``threshold=0`` runs exactly ``max_iter``). The paper
    searches ``p`` in ``R^l``; as proxies are used normalized, ``p`` is projected back onto the unit sphere after
    each step (``J`` is not scale invariant, so this is the objective the layer actually sees)."""
    p = normalize_rows_np(np.asarray(anchor, np.float64))
    for _ in range(max_iter):
        new = normalize_rows_np(p - learning_rate * hard_proxy_objective(p, anchor, members)[1])
        moved = np.linalg.norm(new - p)
        p = new
        if moved <= threshold:
            break
    return p


class HardProxyUpdate(keras.callbacks.Callback):
    """At the start of every epoch, set the ``proxies`` of the model's ``ManifoldProxies`` layer.

    For each meta-class ``k`` one training image is drawn once (``seed``) as its anchor; every epoch its current
    normalized embedding is ``p_k`` (Aziere and Todorovic 2019, Sec. 4.1). With ``harden=True`` it is then replaced
    by the hard proxy ``p*_k`` of eq. 7, estimated on up to ``samples_per_meta_class`` embedded members of ``D_k``
    (:func:`harden_proxy`: up to ``max_iter`` gradient steps of ``learning_rate``, 1e-3 in the paper, early stop
    at ``threshold``); ``harden=False`` keeps ``p_k`` (the "P" ablation). The paper gives no step count: at the
    defaults (100 steps of 1e-3) a proxy moves little from ``p_k`` (a mean ``|p*_k - p_k|`` of 0.015 at the end of
    the Fashion-MNIST experiment of docs/results/edms.md); ``max_iter=100_000, threshold=1e-7`` descends to eq. 7's
    minimum on the unit sphere (0.83 there). ``embedding_model`` maps ``images`` to
    the embeddings the layer receives. ``layer_name``: the ``ManifoldProxies`` layer, or ``None`` for the only one
    in the model (``ot_layers.tensor_ops.find_layer``).

    State: the decision (the proxies) lives in the layer's ``proxies`` variable and is a deterministic function of
    the model's weights at the start of the epoch and of the anchors/members, which depend only on ``seed``; so a
    run resumed by ``keras.callbacks.BackupAndRestore`` (in any callback order) equals an uninterrupted one.
    Non-finite embeddings raise a ``ValueError`` naming ``embedding_model``. ``images`` must fit ``embedding_model``'s
    input (checked when the callback is made), and its embeddings must be the layer's ``(None, dim)`` vectors
    (checked when training begins, from the model's output shape where it is known, else at the first epoch's
    start, before any step); else a ``ValueError`` names ``images`` or ``embedding_model``. In a model that Keras
    builds only at its first step (a ``Sequential`` without an ``Input``, a subclassed model), the layer is built
    from its ``dim`` when training begins, so that the first epoch's proxies are set before that step. The images are
    embedded in batches of ``batch_size`` by ``ot_layers.padded_predict.predict_padded``: on several replicas (an
    ``embedding_model`` built under a ``tf.distribute`` strategy, JAX's ``DataParallel``) a last batch smaller than
    them is padded.
    """

    def __init__(self, embedding_model, images, meta_labels, layer_name=None, harden=True, max_iter=100,
                 learning_rate=1e-3, threshold=0.0, samples_per_meta_class=256, batch_size=256, seed=0):
        super().__init__()
        meta_labels = check_labels(meta_labels, "meta_labels").reshape(-1).astype(np.int64)
        if meta_labels.size == 0:
            raise ValueError("`meta_labels` is empty: give each training image its meta-class.")
        if meta_labels.min() < 0:
            raise ValueError("`meta_labels` must be integers >= 0.")
        self.images = images = check_image_array("images", images)
        if len(meta_labels) != len(images):
            raise ValueError(f"`meta_labels` has {len(meta_labels)} entries but `images` has {len(images)}.")
        self.embedding_model = embedding_model
        self.layer_name = layer_name
        self.harden = check_flag("harden", harden)
        self.max_iter = check_positive_int("max_iter", max_iter)
        self.learning_rate = float(check_positive("learning_rate", learning_rate))
        self.threshold = float(check_non_negative("threshold", threshold))
        check_positive_int("samples_per_meta_class", samples_per_meta_class)
        self.batch_size = check_positive_int("batch_size", batch_size)
        rng = np.random.default_rng(check_seed("seed", seed))
        self.anchors, self.members = [], []
        for k in range(int(meta_labels.max()) + 1):
            indices = rng.permutation(np.flatnonzero(meta_labels == k))
            if len(indices) < 2:
                raise ValueError(f"`meta_labels`: meta-class {k} needs at least two images, got {len(indices)}.")
            self.anchors.append(int(indices[0]))
            self.members.append(indices[1:1 + samples_per_meta_class])
        if not callable(getattr(embedding_model, "predict", None)):
            raise ValueError(f"`embedding_model` must be a Keras model mapping `images` to embeddings, got "
                             f"{type(embedding_model).__name__}.")
        check_fits_model_inputs("images", images, embedding_model, "the embedding model")

    def compute_proxies(self):
        """``(K, dim)`` proxies from the current embeddings."""
        members = np.concatenate(self.members)
        chosen = np.concatenate([np.asarray(self.anchors), members])
        z = np.asarray(predict_padded(self.embedding_model, self.images[chosen], self.batch_size), np.float64)
        # a subclassed model's width is known once it has run: checked before any use (against the layer once the
        # callback has a model)
        layer = self._layer() if self.model is not None else None
        check_embedding_width("embedding_model", z.shape, layer and layer.dim,
                              _layer_description(layer) if layer else "the proxies")
        if not np.all(np.isfinite(z)):
            raise ValueError("`embedding_model` produced non-finite embeddings; the proxies cannot be computed "
                             "(has training diverged?).")
        z = normalize_rows_np(z)
        anchors, rest = z[:len(self.anchors)], z[len(self.anchors):]
        if not self.harden:
            return anchors
        bounds = np.cumsum([0] + [len(m) for m in self.members])
        return np.stack([harden_proxy(anchors[k], rest[bounds[k]:bounds[k + 1]], self.max_iter, self.learning_rate,
                                      self.threshold)
                         for k in range(len(self.anchors))])

    def _layer(self):
        """The ``ManifoldProxies`` layer, checked against ``meta_labels`` and ``embedding_model``'s output shape
        (where the model knows it: a subclassed model's embeddings are checked once computed)."""
        layer = find_layer(self.model, ManifoldProxies, self.layer_name)
        if layer.num_classes != len(self.anchors):
            raise ValueError(f"`meta_labels` has {len(self.anchors)} meta-classes but the layer has "
                             f"num_classes={layer.num_classes}.")
        check_model_embedding_width("embedding_model", self.embedding_model, layer.dim, _layer_description(layer))
        return layer

    def on_train_begin(self, logs=None):
        layer = self._layer()  # a model without the layer, or embeddings of another size, fail before any epoch
        if not layer.built:
            # a model Keras builds only at its first step (a Sequential without an Input, a subclassed model): the
            # proxies are set before that step, so the layer is built here from its `dim` (its proxies' shape does
            # not depend on anything else; an input of another width then fails the layer's input spec)
            with model_strategy_scope(self.model):
                layer.build((None, layer.dim))

    def on_epoch_begin(self, epoch, logs=None):
        layer = self._layer()
        proxies = self.compute_proxies()
        layer.proxies.assign(proxies.astype(np.float32))


def _layer_description(layer):
    return f"the ManifoldProxies layer {layer.name!r} (its `dim`)"
