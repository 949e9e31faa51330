"""HypersphericalPrototypes: cosine classifier on fixed prototypes with a re-assignable label map (DL2PA, Saadabadi
et al. 2024)."""

import keras
import numpy as np
from keras import ops

from ot_layers.backends import eager_scope
from ot_layers.layers.base import ExportableLayer
from ot_layers.solvers import prototypes as prototype_solver
from ot_layers.tensor_ops import at_least, normalize_rows
from ot_layers.validation import (check_in_range, check_labels_per_row, check_positive_int, check_rank, check_same_dim,
                                  check_seed)

try:  # Keras-internal scopes in which a call is only traced for shapes / without state (no prototype estimation)
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope
except ImportError:  # pragma: no cover - other Keras versions
    def in_stateless_scope():
        return False

    def in_symbolic_scope():
        return False


@keras.saving.register_keras_serializable(package="ot_layers")
class HypersphericalPrototypes(ExportableLayer):
    """Logits ``s_k = cos(z, p_{sigma(k)})`` for a feature ``z`` ``(B, dim)`` (Saadabadi et al. 2024, Sec. 3.2.2:
    the cosine of Eq. 6).

    State (all Keras variables, so ``.keras`` files, checkpoints and exported graphs carry it):

    - ``prototypes`` ``(K, dim)`` float32, non-trainable: fixed unit vectors, set once when the layer is built in a
      fresh model: the given ``prototypes``, else ``solvers.estimate_prototypes(K, dim, seed=seed)`` (the simplex
      ETF in closed form when ``dim >= K - 1``, else an annealed max-cosine optimizer that replaces the uniformity
      loss of Saadabadi et al. 2024, Sec. 3.2.1). A layer made from a config (``keras.models.load_model``,
      ``from_config``) does not estimate: its weight is a zero placeholder that the loaded weights fill. Only if it
      is then called for real with the placeholder still all zero (``clone_model`` without copying weights), or
      first called for real before anything built it (then it is built with the estimate), are the prototypes
      estimated, once. On JAX, whose ``fit`` and ``predict`` call layers only while tracing (where a
      variable's value cannot be read), such a layer estimates when it is built, before weights that may follow
      replace the estimate: ``load_model`` then pays for one estimate (memoized in the process; instant in closed
      form, ``dim >= K - 1``, seconds otherwise, about 10 s for ``K = 500, dim = 64``). Nothing is written to disk.
    - ``assignment`` ``(K,)`` int32: the bijection ``sigma`` class -> prototype row (identity at first), changed by
      ``callbacks.PrototypeReassignment`` between epochs;
    - ``representatives`` ``(K, dim)`` float32: class representatives ``c_k``, the L2-normalized exponential moving
      average of the normalized features of class ``k`` (Saadabadi et al. 2024, Sec. 3.2.3, Eq. 8): in a training
      call with ``labels``, ``c_k <- normalize(momentum * c_k + (1 - momentum) * mean_{i: y_i = k} z_i/||z_i||)``
      for every class in the batch. Samples with a non-finite feature, or with a label outside ``0..K-1`` (-1 for an
      unlabelled sample, say), are left out, alike on every backend. Under a distribution strategy the
      replicas' updates are averaged. A frozen layer (``trainable=False``, or inside a frozen model) keeps its
      representatives, as a frozen ``BatchNormalization`` keeps its moving statistics; ``PrototypeReassignment``
      then recomputes the same assignment from them (a change only if they moved since its last re-assignment).

    Train with ``losses.HypersphericalPullLoss`` (``(1 - s_y)^2``, pull towards the assigned prototype only) on the
    logits, passing the integer labels to the layer in training: ``layer(features, labels=labels)``; at inference
    call it without labels. Computes in float32 under any dtype policy (the logits are cast to the compute dtype);
    an all-zero feature gives zero logits with finite gradients; a non-finite feature gives NaN logits for that
    sample only. Inputs are ``(B, dim)`` vectors (pool feature maps before the layer).
    """

    def __init__(self, num_classes, dim, momentum=0.9, prototypes=None, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.num_classes = check_positive_int("num_classes", num_classes)
        if self.num_classes < 2:
            raise ValueError(f"`num_classes` must be >= 2, got {num_classes!r}.")
        self.dim = check_positive_int("dim", dim)
        if self.dim == 1 and self.num_classes > 2:  # a line holds two unit vectors: classes would share prototypes
            raise ValueError(f"`dim` must be >= 2 for more than 2 classes (the unit vectors of dimension 1 are -1 and "
                             f"+1), got dim=1 for num_classes={self.num_classes}.")
        self.momentum = float(check_in_range("momentum", momentum, 0.0, 1.0, high_open=True))
        self.seed = check_seed("seed", seed)
        self._given_prototypes = None
        if prototypes is not None:
            try:
                p = np.asarray(prototypes, dtype=np.float64)
            except (TypeError, ValueError):
                raise ValueError(f"`prototypes` must be a (num_classes, dim) array of numbers, got "
                                 f"{type(prototypes).__name__} {prototypes!r:.80}.") from None
            if p.shape != (self.num_classes, self.dim):
                raise ValueError(f"`prototypes` must have shape (num_classes, dim) = {(self.num_classes, self.dim)}, "
                                 f"got {p.shape}.")
            norms = np.linalg.norm(p, axis=1, keepdims=True)
            if not np.all(np.isfinite(p)) or np.any(norms == 0):
                raise ValueError("`prototypes` must be finite with non-zero rows.")
            self._given_prototypes = (p / norms).astype(np.float32)
        self._from_config = False  # set by from_config: the prototypes come with the loaded weights

    @classmethod
    def from_config(cls, config):
        layer = super().from_config(config)
        layer._from_config = True
        return layer

    def build(self, input_shape):
        check_rank("inputs", input_shape, (2,))
        check_same_dim("inputs", input_shape[-1], "dim", self.dim)
        if self._given_prototypes is not None:
            initial = keras.initializers.Constant(self._given_prototypes)
        elif self._from_config and keras.backend.backend() != "jax":
            initial = "zeros"  # placeholder: load_model fills it (see the class docstring)
        else:
            initial = keras.initializers.Constant(self._estimate())
        # float32 state under any dtype policy (float64 included): call() computes in float32 (class docstring)
        self.prototypes = self.add_weight(name="prototypes", shape=(self.num_classes, self.dim), dtype="float32",
                                          initializer=initial, trainable=False, autocast=False)
        self.assignment = self.add_weight(
            name="assignment", shape=(self.num_classes,), dtype="int32", trainable=False,
            initializer=keras.initializers.Constant(np.arange(self.num_classes, dtype=np.int32)))
        self.representatives = self.add_weight(name="representatives", shape=(self.num_classes, self.dim),
                                               dtype="float32", initializer="zeros", trainable=False,
                                               aggregation="mean", autocast=False)
        self.input_spec = keras.layers.InputSpec(axes={-1: self.dim})  # another dim later: one error line

    def _estimate(self):
        return prototype_solver.estimate_prototypes(self.num_classes, self.dim, seed=self.seed)

    def load_own_variables(self, store):
        super().load_own_variables(store)
        self._from_config = False

    def __call__(self, *args, **kwargs):
        if self._from_config and not self._is_symbolic_call(args, kwargs):
            self._from_config = False  # an unbuilt layer is built by this call, with the estimate: no weights loaded
            if self.built:
                with eager_scope():  # eager, also when first called while a tf.function is traced
                    if not np.any(ops.convert_to_numpy(self.prototypes)):
                        self.prototypes.assign(self._estimate())
        return super().__call__(*args, **kwargs)

    @staticmethod
    def _is_symbolic_call(args, kwargs):
        inputs = args[0] if args else kwargs.get("inputs")
        return isinstance(inputs, keras.KerasTensor) or in_symbolic_scope() or in_stateless_scope()

    def assigned_prototypes(self):
        """``(K, dim)`` float32: row ``k`` is the prototype ``p_{sigma(k)}`` of class ``k``."""
        return ops.take(ops.convert_to_tensor(self.prototypes), ops.convert_to_tensor(self.assignment), axis=0)

    def call(self, inputs, labels=None, training=None):
        z = normalize_rows(ops.cast(inputs, "float32"))
        if training and labels is not None:
            check_labels_per_row("`labels`", labels, "`inputs`", inputs)
            if self.trainable:  # a frozen layer keeps its state, as BatchNormalization keeps its moving statistics
                self._update_representatives(z, labels)
        logits = ops.einsum("bd,kd->bk", z, self.assigned_prototypes())
        return ops.cast(logits, self.compute_dtype)

    def _update_representatives(self, z, labels):
        labels = ops.reshape(ops.cast(labels, "int32"), (-1,))
        z = ops.stop_gradient(z)
        finite = ops.all(ops.isfinite(z), axis=-1)
        z = ops.where(finite[:, None], z, ops.zeros_like(z))
        # A label outside 0..K-1 (-1 for an unlabelled sample, say) goes to an extra segment K that is dropped: the
        # same on every backend (TensorFlow's CPU kernel raises for ids >= K, JAX and PyTorch drop them silently).
        labels = ops.where((labels >= 0) & (labels < self.num_classes), labels, self.num_classes)
        sums = ops.segment_sum(z, labels, num_segments=self.num_classes + 1)[: self.num_classes]
        counts = ops.segment_sum(ops.cast(finite, "float32"), labels,
                                 num_segments=self.num_classes + 1)[: self.num_classes]
        present = counts[:, None] > 0
        batch_means = sums / at_least(counts[:, None], 1.0)
        old = ops.convert_to_tensor(self.representatives)
        moved = normalize_rows(self.momentum * old + (1.0 - self.momentum) * batch_means)
        self.representatives.assign(ops.where(present, moved, old))

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_classes)

    def get_config(self):
        config = super().get_config()
        given = None if self._given_prototypes is None else self._given_prototypes.tolist()
        config.update(num_classes=self.num_classes, dim=self.dim, momentum=self.momentum, prototypes=given,
                      seed=self.seed)
        return config
