"""CCPReinitialization: chance-constrained proxy DML, iterated proxy-based problems with proxies re-initialized by
greedy k-center and a proximal pull towards the previous solution (thesis 003, ch. 3, eq. 3.2.11, Algorithm 2;
SPEC S4)."""
import keras
import numpy as np

from ot_layers.solvers.k_center import greedy_k_center
from ot_layers.validation import check_in_range, check_positive_int


def _unit_rows(x):
    x = np.asarray(x, np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def k_center_proxies(pool_embeddings, current_proxies):
    """Algorithm 2 for one class: from the pool ``(b, d)`` choose ``P`` points (``P`` = number of current proxies
    ``(P, d)``), each the pool point farthest from the current proxies and the points chosen so far. Embeddings and
    proxies are compared L2-normalized; returns the chosen ``(P, d)`` unit vectors."""
    pool, current = _unit_rows(pool_embeddings), _unit_rows(current_proxies)
    return pool[greedy_k_center(pool, len(current), initial=current)]


class CCPReinitialization(keras.callbacks.Callback):
    """Solve a sequence of proxy-based DML problems, re-initializing the proxies between them.

    After every epoch ``validation_score()`` is called (higher is better; the thesis uses validation MAP@R, e.g.
    ``lambda: training.evaluation.retrieval_metrics(embed(x_val), y_val, nmi=False)["map_at_r"]``) and logged as
    ``val_score``. When it has not improved on the current problem's best by more than ``min_delta`` for
    ``patience`` epochs (early stopping per problem, thesis Sec. 3.2.4), the problem is considered solved: the model
    is reset to the problem's best weights ``theta*``, and for every class a pool of
    ``pool_size`` training images is drawn and embedded, and the class's ``P`` proxies are replaced by greedy
    k-center picks from that pool (``k_center_proxies``; ``pool_size == P`` is random sampling). During the next
    problem the proximal term ``(lambda/2) ||theta - theta*||^2`` of eq. 3.2.11 acts through its SGD form
    ``theta <- (1 - lambda) theta + lambda theta*`` after every optimizer step (thesis, "Relation to EMA of
    weights"), on all trainable weights except the proxies; ``proximal = 0`` turns it off, and it is off before the
    first re-initialization. At the end of training the best weights over all problems are restored.

    ``proxy_variable``: the ``keras.Variable`` ``(num_classes, P, d)`` of the proxies (e.g. ``ClassProxies.proxies``
    read by ``ProxyAnchorLoss`` / ``ProxyNCAPlusPlusLoss``). ``train_labels`` must be ``0..num_classes-1``.
    ``reinitializations`` counts the problems solved so far; ``history`` keeps the validation score per epoch.
    """

    def __init__(self, embedding_model, proxy_variable, train_images, train_labels, validation_score, patience=3,
                 pool_size=12, proximal=2e-4, min_delta=0.0, batch_size=256, seed=0):
        super().__init__()
        self.embedding_model = embedding_model
        self.proxy_variable = proxy_variable
        if len(proxy_variable.shape) != 3:
            raise ValueError(f"`proxy_variable` must have shape (num_classes, P, d), got {proxy_variable.shape}.")
        num_classes, per_class, _ = proxy_variable.shape
        self.train_images, self.train_labels = train_images, np.asarray(train_labels).reshape(-1)
        if len(self.train_labels) != len(train_images):
            raise ValueError(f"`train_labels` has {len(self.train_labels)} entries but `train_images` has "
                             f"{len(train_images)}.")
        if set(np.unique(self.train_labels).tolist()) != set(range(num_classes)):
            raise ValueError(f"`train_labels` must hold exactly the classes 0..{num_classes - 1} of the proxies.")
        if not callable(validation_score):
            raise ValueError(f"`validation_score` must be a callable returning a float, got {validation_score!r}.")
        self.validation_score = validation_score
        self.patience = check_positive_int("patience", patience)
        self.pool_size = check_positive_int("pool_size", pool_size)
        if self.pool_size < per_class:
            raise ValueError(f"`pool_size` ({pool_size}) must be at least the number of proxies per class "
                             f"({per_class}).")
        self.proximal = float(check_in_range("proximal", proximal, 0.0, 1.0))
        self.min_delta = float(check_in_range("min_delta", min_delta, 0.0, 1.0))
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.rng = np.random.default_rng(seed)
        self.reinitializations = 0
        self.history = []
        self._anchor = None

    def _embed(self, images):
        return np.asarray(self.embedding_model.predict(images, batch_size=self.batch_size, verbose=0))

    def _pulled_weights(self):
        return [w for w in self.model.trainable_weights if w is not self.proxy_variable]

    def on_train_begin(self, logs=None):
        self._best_score, self._best_weights = -np.inf, None
        self._start_problem()

    def _start_problem(self):
        self._problem_score, self._problem_weights, self._wait = -np.inf, None, 0

    def on_train_batch_end(self, batch, logs=None):
        if self._anchor is None or self.proximal == 0.0:
            return
        for weight, anchor in zip(self._pulled_weights(), self._anchor):
            weight.assign((1.0 - self.proximal) * np.asarray(weight) + self.proximal * anchor)

    def reinitialize_proxies(self):
        """Replace every class's proxies by greedy k-center picks from a fresh pool of its training images."""
        proxies = np.asarray(self.proxy_variable)
        new = np.empty_like(proxies)
        for c in range(proxies.shape[0]):
            members = np.flatnonzero(self.train_labels == c)
            pool = self.rng.choice(members, size=min(self.pool_size, len(members)), replace=False)
            new[c] = k_center_proxies(self._embed(self.train_images[pool]), proxies[c])
        self.proxy_variable.assign(new.astype(proxies.dtype))

    def on_epoch_end(self, epoch, logs=None):
        score = float(self.validation_score())
        self.history.append(score)
        if logs is not None:
            logs["val_score"] = score
        if score > self._best_score:
            self._best_score, self._best_weights = score, self.model.get_weights()
        if score > self._problem_score:
            improved = score > self._problem_score + self.min_delta
            self._problem_score, self._problem_weights = score, self.model.get_weights()
            if improved:
                self._wait = 0
                return
        self._wait += 1
        if self._wait < self.patience:
            return
        self.model.set_weights(self._problem_weights)
        self._anchor = [np.asarray(w) for w in self._pulled_weights()]
        self.reinitialize_proxies()
        self.reinitializations += 1
        self._start_problem()

    def on_train_end(self, logs=None):
        if self._best_weights is not None:
            self.model.set_weights(self._best_weights)
