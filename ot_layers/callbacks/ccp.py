"""CCPReinitialization: chance-constrained proxy DML, iterated proxy-based problems with proxies re-initialized by
greedy k-center and a proximal penalty towards the previous solution (Gurbuz 2022, ch. 3, eq. 3.2.11, Algorithms
1-2)."""
import contextlib

import keras
import numpy as np
from keras import ops

from ot_layers.layers.class_proxies import ClassProxies
from ot_layers.padded_predict import predict_padded
from ot_layers.solvers.k_center import greedy_k_center
from ot_layers.tensor_ops import find_layer, layer_input_model, normalize_rows_np
from ot_layers.validation import (check_embedding_width, check_fits_model_inputs, check_flag, check_image_array,
                                  check_labels, check_model_embedding_width, check_non_negative, check_positive_int,
                                  check_seed)

STATE_ATTRIBUTE = "ccp_state"  # the attribute of the model that holds CCPReinitialization's state


def k_center_proxies(pool_embeddings, current_proxies):
    """Algorithm 2 for one class: from the pool ``(b, d)`` choose ``P`` points (``P`` = number of current proxies
    ``(P, d)``), each the pool point farthest from the current proxies and the points chosen so far. Embeddings and
    proxies are compared L2-normalized; returns the chosen ``(P, d)`` unit vectors."""
    pool, current = normalize_rows_np(np.asarray(pool_embeddings, np.float64)), normalize_rows_np(
        np.asarray(current_proxies, np.float64))
    return pool[greedy_k_center(pool, len(current), initial=current)]


class ProximalPenalty:
    """The weight regularizer ``(lambda/2) ||theta - theta*||^2`` of eq. 3.2.11 for one variable ``theta``, switched
    by the scalar variable ``active`` (0 before the first re-initialization); chains a regularizer already set."""

    def __init__(self, anchor, strength, active, previous=None):
        self.anchor, self.strength, self.active, self.previous = anchor, float(strength), active, previous

    def __call__(self, value):
        value = ops.convert_to_tensor(value)
        anchor = ops.cast(ops.convert_to_tensor(self.anchor), value.dtype)
        active = ops.cast(ops.convert_to_tensor(self.active), value.dtype)
        penalty = 0.5 * self.strength * active * ops.sum(ops.square(value - anchor))
        if self.previous is not None:
            penalty = penalty + self.previous(value)
        return penalty


class CCPState(keras.layers.Layer):
    """Everything ``CCPReinitialization`` decides, as non-trainable Keras variables.

    Scalars: ``best_score`` (over all problems), ``problem_score`` (the current problem's reference: its best score
    as far as gains above ``min_delta`` moved it), ``wait`` (epochs without such a gain), ``reinitializations``
    (problems solved; also the round of the pool draw's seed) and ``proximal_active``; copies: ``anchors``
    (``theta*``, one per pulled weight), ``problem_best`` (the weights at ``problem_score``) and ``best`` (one per
    model weight; ``best`` only with ``restore_best_weights``). Attached to the model as
    ``model.ccp_state``, so ``model.save_weights`` / ``BackupAndRestore`` checkpoints carry it.
    """

    def __init__(self, pulled_weights, model_weights, keep_best, **kwargs):
        super().__init__(**kwargs)

        def scalar(name, value):
            return self.add_weight(name=name, shape=(), initializer=keras.initializers.Constant(value),
                                   trainable=False)

        def copies(prefix, weights):
            return [self.add_weight(name=f"{prefix}_{i}", shape=tuple(w.shape), dtype=w.dtype, initializer="zeros",
                                    trainable=False) for i, w in enumerate(weights)]

        self.best_score = scalar("best_score", -np.inf)
        self.problem_score = scalar("problem_score", -np.inf)
        self.wait = scalar("wait", 0.0)
        self.reinitializations = scalar("reinitializations", 0.0)
        self.proximal_active = scalar("proximal_active", 0.0)
        self.anchors = copies("anchor", pulled_weights)
        self.problem_best = copies("problem_best", model_weights)
        self.best = copies("best", model_weights) if keep_best else []
        self.built = True

    def call(self, inputs):
        return inputs


def remove_ccp_state(model):
    """Take ``model.ccp_state`` (:class:`CCPReinitialization`'s state) off ``model`` and return it (``None`` when
    the model has none): ``model.weights``, ``get_weights()`` and ``count_params()`` are then the architecture's
    own again. A later ``fit`` with a ``CCPReinitialization`` starts CCP over (round 0, no ``theta*``)."""
    state = getattr(model, STATE_ATTRIBUTE, None)
    if state is not None:
        model._tracker.untrack(state)  # Keras' `del` keeps a sub-layer in the model's tracked layers
        delattr(model, STATE_ATTRIBUTE)
    return state


def _attach(model, state):
    """``model.ccp_state = state``; a built subclassed model locks its state (Keras' tracker) against new
    sub-layers, so it is unlocked for this one, as Keras does to untrack a variable."""
    tracker = getattr(model, "_tracker", None)
    locked = bool(getattr(tracker, "locked", False))
    if locked:
        tracker.unlock()
    try:
        setattr(model, STATE_ATTRIBUTE, state)
    finally:
        if locked:
            tracker.lock()


def model_strategy_scope(model):
    """The scope of ``model``'s distribution strategy (Keras' ``distribute_strategy`` on TensorFlow), for variables
    a callback makes or builds for it; a no-op context where it has none (JAX, PyTorch)."""
    strategy = getattr(model, "distribute_strategy", None)
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def _copy(sources, targets):
    """Each target variable takes its source variable's value, as a copy: on JAX assigning a variable itself would
    leave both holding one buffer, which the next compiled training step donates twice (an error)."""
    for source, target in zip(sources, targets):
        target.assign(ops.copy(ops.convert_to_tensor(source)))


class CCPReinitialization(keras.callbacks.Callback):
    """Solve a sequence of proxy-based DML problems, re-initializing the proxies between them (Algorithm 1).

    After every epoch ``validation_score()`` is called (higher is better; the thesis uses validation MAP@R, e.g.
    ``lambda: training.evaluation.retrieval_metrics(embed(x_val), y_val, nmi=False)["map_at_r"]``) and logged as
    ``val_score``. When it has not improved on the current problem's reference score by more than ``min_delta`` for
    ``patience`` epochs (early stopping per problem, thesis Sec. 3.2.4), the problem is solved: the model is reset to
    the problem's best weights ``theta*``. As in ``keras.callbacks.EarlyStopping``, the reference score and
    ``theta*`` move only on a gain above ``min_delta`` (small gains add up against the reference, so steady slow
    progress is no plateau); the overall best of ``restore_best_weights`` follows every gain. Then for every class
    a pool of ``pool_size`` training images is drawn (seeded by ``(seed, round)``) and embedded, and the class's
    proxies are replaced by greedy k-center picks from it (``k_center_proxies``, Algorithm 2; ``pool_size ==
    num_proxies`` is random sampling). From then on the proximal penalty ``(lambda/2) ||theta - theta*||^2`` of
    eq. 3.2.11 (``lambda = proximal``, 2e-4 in the thesis) is part of the training loss, in-graph: it is installed
    as a weight regularizer (``ProximalPenalty``) on every trainable weight except the proxies, so its gradient
    ``lambda (theta - theta*)`` goes through the optimizer with the loss gradient (it respects the learning rate and
    the optimizer, as ``g_theta`` in Algorithm 1; Algorithm 1 prints ``lambda (theta* - theta)``, the opposite sign,
    but the gradient of eq. 3.2.11 is ``lambda (theta - theta*)``, the sign that pulls ``theta`` towards ``theta*``
    under descent). It is off before the first re-initialization; ``proximal=0`` turns it off. With
    ``restore_best_weights`` the best weights over all problems are restored at the end of training.

    Every decision lives in the Keras variables of a ``CCPState`` that the callback attaches to the model as
    ``model.ccp_state`` (scores, patience counter, round counter, ``theta*``, the problem's and the overall best
    weights), so a run interrupted after any epoch and resumed with ``keras.callbacks.BackupAndRestore`` continues
    exactly. Place this callback before ``BackupAndRestore`` / ``ModelCheckpoint``. The state is part of the model
    (its variables are in ``model.weights``, ``get_weights()`` and ``count_params()``, about three copies of the
    weights), so ``other.set_weights(model.get_weights())`` for a model of the same architecture needs it gone
    first: :func:`remove_ccp_state` takes it off (CCP then starts over in a later ``fit``). ``save_weights`` /
    ``load_weights`` into a fresh model and ``.keras`` files work with it on. A model that Keras builds only at its
    first training step (a ``Sequential`` without an ``Input``, a subclassed model) gets its state, and the penalty,
    after that step (the penalty is off until the first re-initialization, so the run is the same).

    Args:
      train_images, train_labels: the training set the pools are drawn from; labels ``0..num_classes-1``.
      validation_score: zero-argument callable returning a float.
      layer_name: the ``ClassProxies`` layer's name, or ``None`` for the only one in the model.
      embedding_model: maps ``train_images`` to the vectors the layer receives; ``None`` builds
        ``keras.Model(model.inputs, layer.input)``, so a subclassed model (which has no such graph) needs one.
      patience, pool_size, proximal, min_delta, restore_best_weights, batch_size, seed: as above (``batch_size`` for
        embedding the pools, with ``ot_layers.padded_predict.predict_padded``: under a strategy of several replicas
        a last batch smaller than them is padded, not left to fail on an empty replica batch).

    ``train_images`` must fit the inputs of ``embedding_model`` (checked when the callback is made) or, without
    one, of the model (checked in ``set_model``, before any epoch); else a ``ValueError`` names ``train_images``.
    ``embedding_model`` must give vectors of the proxies' width, checked in ``set_model`` (a subclassed model, whose
    outputs are unknown until it runs, on one image when training begins); without one, the layer's inputs must have
    the proxies' width and the model a functional graph up to the layer (checked in ``set_model``; for a
    ``Sequential`` without an ``Input`` once it is built). Else a ``ValueError`` names ``embedding_model``.

    ``history`` keeps the validation scores seen by this instance; ``reinitializations`` is read from the state.
    """

    def __init__(self, train_images, train_labels, validation_score, layer_name=None, embedding_model=None,
                 patience=3, pool_size=12, proximal=2e-4, min_delta=0.0, restore_best_weights=True, batch_size=256,
                 seed=0):
        super().__init__()
        train_images = check_image_array("train_images", train_images)
        self.train_images = train_images
        self.train_labels = check_labels(train_labels, "train_labels").reshape(-1).astype(np.int64)
        if len(self.train_labels) != len(train_images):
            raise ValueError(f"`train_labels` has {len(self.train_labels)} entries but `train_images` has "
                             f"{len(train_images)}.")
        if not callable(validation_score):
            raise ValueError(f"`validation_score` must be a callable returning a float, got {validation_score!r}.")
        self.validation_score = validation_score
        self.layer_name = layer_name
        if embedding_model is not None and not callable(getattr(embedding_model, "predict", None)):
            raise ValueError(f"`embedding_model` must be None or a Keras model mapping `train_images` to the vectors "
                             f"the ClassProxies layer receives, got {type(embedding_model).__name__}.")
        if embedding_model is not None:
            check_fits_model_inputs("train_images", train_images, embedding_model, "the embedding model")
        self.embedding_model = embedding_model
        self.patience = check_positive_int("patience", patience)
        self.pool_size = check_positive_int("pool_size", pool_size)
        self.proximal = float(check_non_negative("proximal", proximal))
        self.min_delta = float(check_non_negative("min_delta", min_delta))
        self.restore_best_weights = check_flag("restore_best_weights", restore_best_weights)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.seed = check_seed("seed", seed)
        self.history = []
        self._installed = []
        self._ready = False  # whether model.ccp_state is attached for the current model (see set_model)
        self._penalty_due = False  # the proximal penalty is to be installed once the model is built (fit only)

    # ---- set-up -----------------------------------------------------------------------------------------------

    def _layer(self):
        return find_layer(self.model, ClassProxies, self.layer_name)

    def _proxy_width(self):
        """The proxies' width (None before the layer is built without ``dim``: the input's width) and how a width
        error names the layer."""
        layer = self._layer()
        width = int(layer.proxies.shape[-1]) if layer.built else layer.dim
        return width, f"the ClassProxies layer {layer.name!r} (the width of its proxies)"

    def _check_embedding_model(self):
        """True once ``embedding_model``'s width is checked; False while its outputs are unknown (subclassed)."""
        width, description = self._proxy_width()
        return width is None or check_model_embedding_width("embedding_model", self.embedding_model, width,
                                                            description)

    def _check_layer_input_width(self, layer):
        """Without ``embedding_model`` the pools are the layer's inputs: k-center picks from them are proxies only
        where they have the proxies' width (``output="packed"`` may take vectors of another space)."""
        try:
            input_width = layer.input.shape[-1]
        except (AttributeError, ValueError):  # a layer called more than once, or not in a functional graph
            return
        width, _ = self._proxy_width()
        if input_width is not None and width is not None and int(input_width) != int(width):
            raise ValueError(f"`embedding_model`: the ClassProxies layer {layer.name!r} takes vectors of width "
                             f"{input_width} and its proxies have width {width}; CCP re-initializes proxies from "
                             f"embeddings of the training images, so give an `embedding_model` that maps them into "
                             f"the proxies' space.")

    def _model_weights(self):
        state_ids = {id(v) for v in getattr(self.model, STATE_ATTRIBUTE).weights} \
            if hasattr(self.model, STATE_ATTRIBUTE) else set()
        return [w for w in self.model.weights if id(w) not in state_ids]

    def _pulled_weights(self):
        proxies = self._layer().proxies
        return [w for w in self.model.trainable_weights if w is not proxies]

    @property
    def state(self):
        """The model's ``CCPState``."""
        state = getattr(self.model, STATE_ATTRIBUTE, None)
        if state is None:
            raise ValueError(f"`model`: {self.model.name!r} has no `{STATE_ATTRIBUTE}` yet: CCPReinitialization "
                             f"attaches it once the model is built (at its first training step at the latest).")
        return state

    @property
    def reinitializations(self):
        return int(round(float(self.state.reinitializations.numpy())))

    def set_model(self, model):
        super().set_model(model)
        layer = self._layer()
        if self.embedding_model is None:  # the pools go through keras.Model(model.inputs, layer.input)
            check_fits_model_inputs("train_images", self.train_images, model)
            self._check_layer_input_width(layer)
            if not self._built() and not isinstance(model, keras.Sequential):
                self._check_layer_input_model(layer)  # else once the model is built (_set_up_state)
        else:
            self._check_embedding_model()
        num_classes, per_class = layer.num_classes, layer.num_proxies
        if set(np.unique(self.train_labels).tolist()) != set(range(num_classes)):
            raise ValueError(f"`train_labels` must hold exactly the classes 0..{num_classes - 1} of the proxies.")
        if self.pool_size < per_class:
            raise ValueError(f"`pool_size` ({self.pool_size}) must be at least the number of proxies per class "
                             f"({per_class}).")
        counts = np.bincount(self.train_labels.astype(np.int64), minlength=num_classes)
        if counts.min() < per_class:
            raise ValueError(f"`train_labels`: class {int(counts.argmin())} has {int(counts.min())} training "
                             f"image(s), fewer than its {per_class} proxies to re-initialize from them.")
        self._ready = False
        if self._built():  # else (Keras builds the model at its first step) at the first training batch
            self._set_up_state()

    def _built(self):
        return bool(self.model.built and self._layer().built)

    def _check_layer_input_model(self, layer):
        """Without ``embedding_model`` the pools are read through the model's functional graph, which a subclassed
        model (or a layer inside one) does not have: refused before any epoch, not at the first plateau."""
        try:
            layer_input_model(self.model, layer)
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"`embedding_model`: without it CCP embeds `train_images` through the functional graph "
                             f"of model {self.model.name!r} up to the ClassProxies layer {layer.name!r}, which that "
                             f"model does not have (a subclassed model); pass an `embedding_model` that maps "
                             f"`train_images` to the vectors the layer receives.") from None

    def _set_up_state(self):
        """Attach (or check) ``model.ccp_state``; needs the model's weights, so the model built."""
        if self.embedding_model is None:
            self._check_layer_input_model(self._layer())
        pulled, weights = self._pulled_weights(), self._model_weights()
        model = self.model
        state = getattr(model, STATE_ATTRIBUTE, None)
        if state is None:
            with model_strategy_scope(model):
                state = CCPState(pulled, weights, self.restore_best_weights, name=STATE_ATTRIBUTE)
            _attach(model, state)
        elif [tuple(a.shape) for a in state.anchors] != [tuple(w.shape) for w in pulled] \
                or len(state.problem_best) != len(weights) or bool(state.best) != self.restore_best_weights:
            raise ValueError(
                f"The model's `{STATE_ATTRIBUTE}` (scores, rounds, theta*) was made for other weights or another "
                f"`restore_best_weights` (it keeps the best weights: {bool(state.best)}); resume with the "
                f"settings that made it, or delete `model.{STATE_ATTRIBUTE}` to start CCP over.")
        self._ready = True

    def _prepare(self):
        """The state (and, in ``fit``, the proximal penalty) once the model is built; False while it is not (a model
        Keras builds at its first training step: a ``Sequential`` without an ``Input``, a subclassed model)."""
        if not self._ready:
            if not self._built():
                return False
            self._set_up_state()
        if self._penalty_due:
            self._penalty_due = False
            self._install_penalty(self._pulled_weights(), self.state)
        return True

    def on_train_begin(self, logs=None):
        if self.embedding_model is not None and not self._check_embedding_model():
            self._embed(self.train_images[:1])  # a subclassed model: its width, before the first step
        # installed for fit only (set_model also runs for evaluate and predict, whose end would not remove it); on
        # a model Keras builds at its first step, after that step (the penalty is off until the first re-init)
        self._penalty_due = True
        self._prepare()

    def on_train_batch_end(self, batch, logs=None):
        if not self._ready or self._penalty_due:  # a model Keras has just built at its first step
            self._prepare()

    def remove_penalty(self):
        """Take the proximal penalty off the weights. ``fit`` does so at its end; call this after a ``fit`` that
        stopped with an exception (Keras then skips ``on_train_end``), before evaluating or training without
        this callback."""
        self._uninstall_penalty()

    def _install_penalty(self, pulled, state):
        if self._installed or self.proximal == 0.0:
            return
        for weight, anchor in zip(pulled, state.anchors):
            self._installed.append((weight, weight.regularizer))
            weight.regularizer = ProximalPenalty(anchor, self.proximal, state.proximal_active, weight.regularizer)
        # trace again with the penalty: fit made its train function before on_train_begin and calls it from there
        self.model.make_train_function(force=True)
        self.model.test_function = None

    def _uninstall_penalty(self):
        for weight, previous in self._installed:
            weight.regularizer = previous
        if self._installed:
            self.model.train_function = None
            self.model.test_function = None
        self._installed = []

    # ---- the algorithm ----------------------------------------------------------------------------------------

    def _embed(self, images):
        model = self.embedding_model
        if model is None:
            model = layer_input_model(self.model, self._layer())
        embeddings = np.asarray(predict_padded(model, images, self.batch_size))
        if self.embedding_model is not None:  # a subclassed model's width is known once it has run
            check_embedding_width("embedding_model", embeddings.shape, *self._proxy_width())
        if not np.all(np.isfinite(embeddings)):
            raise ValueError("`train_images`: their embeddings hold NaN or Inf.")
        return embeddings

    def reinitialize_proxies(self):
        """Replace every class's proxies by greedy k-center picks from a fresh pool of its training images; the pool
        of round ``r`` (``reinitializations``) is drawn with ``numpy.random.default_rng([seed, r])``."""
        proxies_variable = self._layer().proxies
        proxies = np.asarray(proxies_variable)
        rng = np.random.default_rng([self.seed, self.reinitializations])
        new = np.empty_like(proxies)
        for c in range(proxies.shape[0]):
            members = np.flatnonzero(self.train_labels == c)
            pool = rng.choice(members, size=min(self.pool_size, len(members)), replace=False)
            new[c] = k_center_proxies(self._embed(self.train_images[pool]), proxies[c])
        proxies_variable.assign(new.astype(proxies.dtype))

    def on_epoch_end(self, epoch, logs=None):
        value = self.validation_score()
        number = None
        if not isinstance(value, (bool, str, bytes, dict, type(None))):
            try:  # a Python or NumPy number, or a scalar tensor of any backend
                number = np.asarray(keras.ops.convert_to_numpy(value))
            except (TypeError, ValueError):
                number = None
        if number is None or number.size != 1 or not np.issubdtype(number.dtype, np.number):
            raise ValueError(f"`validation_score` must return a float, got {value!r}.")
        score = float(number.reshape(()))
        if not np.isfinite(score):
            raise ValueError(f"`validation_score` returned {score!r}.")
        self.history.append(score)
        if logs is not None:
            logs["val_score"] = score
        self._prepare()
        state = self.state
        weights = self._model_weights()
        if self.restore_best_weights and score > float(state.best_score.numpy()):
            state.best_score.assign(score)  # the raw best over all problems
            _copy(weights, state.best)
        # as keras.callbacks.EarlyStopping: the reference (and theta*) moves only on a gain above min_delta, so
        # small gains add up against it instead of each one resetting it
        if score > float(state.problem_score.numpy()) + self.min_delta:
            state.problem_score.assign(score)
            _copy(weights, state.problem_best)
            state.wait.assign(0.0)
            return
        state.wait.assign_add(1.0)
        if float(state.wait.numpy()) < self.patience:
            return
        _copy(state.problem_best, weights)  # theta* <- the problem's best weights
        _copy(self._pulled_weights(), state.anchors)
        self.reinitialize_proxies()
        state.reinitializations.assign_add(1.0)
        state.proximal_active.assign(1.0)
        state.problem_score.assign(-np.inf)
        state.wait.assign(0.0)

    def on_train_end(self, logs=None):
        self._penalty_due = False
        if not self._prepare():  # no training step ran on a model Keras builds at its first step
            self._uninstall_penalty()
            return
        state = self.state
        if self.restore_best_weights and np.isfinite(float(state.best_score.numpy())):
            _copy(state.best, self._model_weights())
        self._uninstall_penalty()
