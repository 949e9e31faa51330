"""The zoo's small task layers: L2 normalization of embeddings, the few-shot episode split, the support set's class
means and prototype logits (Snell et al. 2017)."""
import keras
from keras import ops

from ot_layers.backends import values_known
from ot_layers.layers.base import ExportableLayer
from ot_layers.tensor_ops import as_compute_dtype, at_least, label_columns, normalize_rows
from ot_layers.validation import (
    check_choice, check_input_pair, check_label_shape, check_labels, check_labels_per_row, check_positive,
    check_positive_int, check_rank, check_same_dim,
)

PROTONET_METRICS = ("euclidean", "cosine")


@keras.saving.register_keras_serializable(package="ot_layers")
class L2Normalization(ExportableLayer):
    """Rows divided by their L2 norm, computed in float32 (``ot_layers.tensor_ops.normalize_rows``): an all-zero
    row stays zero with a finite gradient (also under ``mixed_float16``), NaN stays in its row."""

    def call(self, inputs):
        return ops.cast(normalize_rows(as_compute_dtype(inputs)), self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)


@keras.saving.register_keras_serializable(package="ot_layers")
class SplitEpisode(ExportableLayer):
    """``[features, query_images] -> [features[:B], features[B:]]`` with ``B`` the number of query images: splits
    the backbone output of the concatenated ``[query; support]`` batch (one batch, as episodic training runs it,
    so BatchNorm's training statistics cover the whole episode)."""

    def call(self, inputs):
        features, query = inputs
        count = ops.shape(query)[0]
        return features[:count], features[count:]

    def compute_output_shape(self, input_shape):
        shape = (None,) + tuple(input_shape[0][1:])
        return shape, shape


@keras.saving.register_keras_serializable(package="ot_layers")
class SupportClassMeans(ExportableLayer):
    """``[support (S, ...), support_labels (S,)] -> (ways, ...)``: the mean of each class's support samples
    (feature maps or vectors), classes ``0..ways-1``; a class without support samples gets zeros. Labels outside
    that range (an episode's classes kept under their data set's numbers, say 5-9) or not whole numbers (1.5,
    which the cast to int32 would make class 1; ``ot_layers.validation.check_labels``) raise ``ValueError`` where
    their values are known (eager calls; PyTorch outside ``torch.compile``); in a traced call (``tf.function``,
    ``jax.jit``, an exported graph) a label outside the range matches no class and is ignored. Computed in float32
    as a one-hot product (XLA-compilable, exportable)."""

    INPUT_NAMES = ("support", "support_labels")

    def __init__(self, ways, **kwargs):
        super().__init__(**kwargs)
        self.ways = check_positive_int("ways", ways)

    def build(self, input_shape):
        # the first call's inputs, checked before Keras' report of a failed call (see check_input_pair)
        support_shape, labels_shape = check_input_pair(self, input_shape)
        check_label_shape("`support_labels`", labels_shape, "`support`", support_shape)

    def call(self, inputs):
        support, labels = check_input_pair(self, inputs)
        check_labels_per_row("`support_labels`", labels, "`support`", support)
        if values_known(labels):
            self._check_label_range(check_labels(ops.convert_to_numpy(labels), "support_labels"))
        support = as_compute_dtype(support)
        # one-hot by comparison: a label outside 0..ways-1 matches no class on every backend
        one_hot = ops.cast(label_columns(ops.cast(labels, "int32"), self.ways), support.dtype)
        counts = ops.sum(one_hot, axis=0)  # (ways,)
        sums = ops.einsum("sw,s...->w...", one_hot, support)  # any rank of support (also unknown)
        counts = ops.reshape(at_least(counts, 1.0),
                             (self.ways,) + (1,) * (len(support.shape) - 1))
        return ops.cast(sums / counts, self.compute_dtype)

    def _check_label_range(self, labels):
        outside = (labels < 0) | (labels >= self.ways)
        if outside.any():
            raise ValueError(f"`support_labels` must number the episode's classes 0..{self.ways - 1}, got "
                             f"{int(labels[outside].reshape(-1)[0])}; renumber them, e.g. with "
                             "numpy.unique(labels, return_inverse=True)[1].")

    def compute_output_shape(self, input_shape):
        return (self.ways,) + tuple(input_shape[0][1:])

    def get_config(self):
        config = super().get_config()
        config.update(ways=self.ways)
        return config


@keras.saving.register_keras_serializable(package="ot_layers")
class PrototypeLogits(ExportableLayer):
    """ProtoNet's logits (Snell et al. 2017, Eq. 1-2): ``[query (B, D), prototypes (N, D)] -> (B, N)``.

    ``metric="euclidean"``: ``-scale * ||q - c_k||^2`` (the paper's squared Euclidean distance); ``"cosine"``:
    ``scale * cos(q, c_k)`` (the cosine variant used next to DeepEMD, whose ``scale`` is 12.5). Computed in
    float32; an all-zero vector has cosine 0 with finite gradients.
    """

    INPUT_NAMES = ("query", "prototypes")

    def __init__(self, metric="euclidean", scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.metric = check_choice("metric", metric, PROTONET_METRICS)
        self.scale = float(check_positive("scale", scale))

    @staticmethod
    def check_shapes(query_shape, prototypes_shape):
        check_rank("query", query_shape, (2,))
        check_rank("prototypes", prototypes_shape, (2,))
        check_same_dim("query", query_shape[-1], "prototypes", prototypes_shape[-1])

    def build(self, input_shape):
        # the first call's inputs, checked before Keras' report of a failed call (see check_input_pair)
        self.check_shapes(*check_input_pair(self, input_shape))

    def call(self, inputs):
        query, prototypes = check_input_pair(self, inputs)
        self.check_shapes(query.shape, prototypes.shape)
        query, prototypes = as_compute_dtype(query), as_compute_dtype(prototypes)
        if self.metric == "cosine":
            logits = ops.einsum("bd,nd->bn", normalize_rows(query), normalize_rows(prototypes))
        else:
            logits = -ops.sum(ops.square(query[:, None, :] - prototypes[None, :, :]), axis=-1)
        return ops.cast(self.scale * logits, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0][0], input_shape[1][0])

    def get_config(self):
        config = super().get_config()
        config.update(metric=self.metric, scale=self.scale)
        return config
