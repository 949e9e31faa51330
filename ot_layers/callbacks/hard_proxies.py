"""HardProxyUpdate: per-epoch (hard) meta-class proxies for EDMS (paper 002, Sec. 4; SPEC S7)."""
import keras
import numpy as np

from ot_layers.callbacks.prototype_reassignment import find_layer
from ot_layers.layers.manifold_proxies import ManifoldProxies
from ot_layers.validation import check_positive, check_positive_int


def hard_proxy_objective(proxy, anchor, members):
    """``J(p) = log(1 + sum_n exp(p.x_n - p.p_k))`` (paper 002, eq. 7) and its gradient
    ``sum_n w_n (x_n - p_k)`` with ``w_n = exp(a_n) / (1 + sum exp(a))``, ``a_n = p.(x_n - p_k)``."""
    diff = np.asarray(members, np.float64) - np.asarray(anchor, np.float64)[None, :]
    a = diff @ np.asarray(proxy, np.float64)
    shift = max(a.max(initial=0.0), 0.0)
    e = np.exp(a - shift)
    denominator = np.exp(-shift) + e.sum()
    return float(np.log(denominator) + shift), (e / denominator) @ diff


def harden_proxy(anchor, members, steps=100, learning_rate=1e-3):
    """``p*_k``: ``steps`` projected gradient-descent steps on ``J`` from ``p = p_k`` (eq. 7). The paper searches
    ``p`` in ``R^l``; as proxies are used normalized, ``p`` is projected back onto the unit sphere after each step
    (``J`` is not scale invariant, so this is the objective the layer actually sees)."""
    p = np.asarray(anchor, np.float64).copy()
    for _ in range(steps):
        p -= learning_rate * hard_proxy_objective(p, anchor, members)[1]
        p /= max(np.linalg.norm(p), 1e-12)
    return p


class HardProxyUpdate(keras.callbacks.Callback):
    """At the start of every epoch, set the ``proxies`` of the model's ``ManifoldProxies`` layer.

    For each meta-class ``k`` one training image is drawn once (``seed``) as its anchor; every epoch its current
    normalized embedding is ``p_k`` (paper 002, Sec. 4.1). With ``harden=True`` it is then replaced by the hard
    proxy ``p*_k`` of eq. 7, estimated on up to ``samples_per_meta_class`` embedded members of ``D_k``
    (``steps`` gradient steps, ``learning_rate`` 1e-3 in the paper); ``harden=False`` keeps ``p_k`` (the "P"
    ablation). ``embedding_model`` maps ``images`` to the embeddings the layer receives. The proxies live in the
    layer's variable, and the anchors depend only on ``seed``, so checkpoints and resumes carry the state.
    """

    def __init__(self, embedding_model, images, meta_labels, layer_name=None, harden=True, steps=100,
                 learning_rate=1e-3, samples_per_meta_class=256, batch_size=256, seed=0):
        super().__init__()
        meta_labels = np.asarray(meta_labels).reshape(-1)
        if len(meta_labels) != len(images):
            raise ValueError(f"`meta_labels` has {len(meta_labels)} entries but `images` has {len(images)}.")
        self.embedding_model = embedding_model
        self.images = images
        self.layer_name = layer_name
        self.harden = bool(harden)
        self.steps = check_positive_int("steps", steps)
        self.learning_rate = float(check_positive("learning_rate", learning_rate))
        check_positive_int("samples_per_meta_class", samples_per_meta_class)
        self.batch_size = check_positive_int("batch_size", batch_size)
        rng = np.random.default_rng(seed)
        self.anchors, self.members = [], []
        for k in range(int(meta_labels.max()) + 1):
            indices = rng.permutation(np.flatnonzero(meta_labels == k))
            if len(indices) < 2:
                raise ValueError(f"`meta_labels`: meta-class {k} needs at least two images, got {len(indices)}.")
            self.anchors.append(int(indices[0]))
            self.members.append(indices[1:1 + samples_per_meta_class])

    def compute_proxies(self):
        """``(K, dim)`` proxies from the current embeddings."""
        members = np.concatenate(self.members)
        chosen = np.concatenate([np.asarray(self.anchors), members])
        z = np.asarray(self.embedding_model.predict(self.images[chosen], batch_size=self.batch_size, verbose=0),
                       np.float64)
        z /= np.maximum(np.linalg.norm(z, axis=1, keepdims=True), 1e-12)
        anchors, rest = z[:len(self.anchors)], z[len(self.anchors):]
        if not self.harden:
            return anchors
        bounds = np.cumsum([0] + [len(m) for m in self.members])
        return np.stack([harden_proxy(anchors[k], rest[bounds[k]:bounds[k + 1]], self.steps, self.learning_rate)
                         for k in range(len(self.anchors))])

    def on_epoch_begin(self, epoch, logs=None):
        layer = find_layer(self.model, ManifoldProxies, self.layer_name)
        if layer.num_proxies != len(self.anchors):
            raise ValueError(f"The layer has {layer.num_proxies} proxies but `meta_labels` has {len(self.anchors)} "
                             "meta-classes.")
        layer.proxies.assign(self.compute_proxies().astype(np.float32))
