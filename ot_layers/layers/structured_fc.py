"""StructuredFC: DeepEMD's structured fully connected layer for k-shot classification (Zhang et al. 2022, Sec. 4.5)."""
import keras
import numpy as np

from ot_layers.layers.base import ExportableLayer
from ot_layers.layers.weight_initializer import resolve_initializer
from ot_layers.layers.emd_head import EMDHead
from ot_layers.validation import check_labels, check_positive_int, check_rank


@keras.saving.register_keras_serializable(package="ot_layers")
class StructuredFC(ExportableLayer):
    """A learnable node set per class, compared to the query's local features by EMD (Zhang et al. 2022, Sec. 4.5).

    Class ``k`` owns nodes ``Phi_k`` of shape ``(num_nodes, d)`` (the shape of one flattened feature map); the logit
    of a query node set ``U`` is ``EMDHead(U, Phi_k)``. For k-shot episodes the nodes start from the mean support
    feature map of each class (:meth:`initialize_from_support`) and are fine-tuned by SGD on the support set with the
    backbone frozen (``training.evaluation.structured_fc.fine_tune_structured_fc``).

    Input ``(B, H, W, d)`` or ``(B, n, d)``; output logits ``(B, num_classes)``. ``head`` holds the
    :class:`EMDHead` settings (``scale``, ``method``, ``node_weights``, ...); ``initializer`` initializes the nodes
    ``(num_classes, num_nodes, d)``. Runs on TensorFlow, JAX and PyTorch (``keras.ops``, as :class:`EMDHead`).
    """

    def __init__(self, num_classes, num_nodes, head=None, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.num_nodes = check_positive_int("num_nodes", num_nodes)
        if head is not None and not isinstance(head, dict):
            raise ValueError(f"`head` must be a dict of EMDHead arguments (e.g. {{'method': 'sinkhorn'}}), got "
                             f"{head!r}.")
        self.head_config = dict(head or {})
        owned = sorted(set(self.head_config) & {"dtype", "name"})
        if owned:
            raise ValueError(f"`head` must not set {owned}: the head takes StructuredFC's dtype policy and is "
                             "named 'emd'; pass dtype to StructuredFC itself.")
        self.initializer = resolve_initializer("initializer", initializer)
        self.head = EMDHead(**self.head_config, dtype=self.dtype_policy, name="emd")
        self.supports_jit = self.head.supports_jit

    def _export_blocker_reason(self):
        """The inner :class:`EMDHead`'s: ``None`` for ``method="sinkhorn"``, a reason for ``"exact"``."""
        return self.head.export_blocker

    def build(self, input_shape):
        check_rank("inputs", input_shape, (3, 4))
        if input_shape[-1] is None:
            raise ValueError("StructuredFC needs a known feature dimension (the last axis of `inputs`).")
        self.nodes = self.add_weight(name="nodes", shape=(self.num_classes, self.num_nodes, int(input_shape[-1])),
                                     initializer=self.initializer, trainable=True)

    def initialize_from_support(self, features, labels):
        """Set each class's nodes to the mean of its support feature maps ``(S, H, W, d)`` or ``(S, n, d)``."""
        features = np.asarray(keras.ops.convert_to_numpy(features), dtype=np.float32)
        if features.ndim == 4:  # (S, H, W, d) -> (S, H*W, d), as ot_layers.tensor_ops.flatten_feature_map
            features = features.reshape(features.shape[0], -1, features.shape[-1])
        labels = check_labels(labels, "labels").reshape(-1)
        if features.ndim != 3 or features.shape[1] != self.num_nodes:
            raise ValueError(f"`features` must have {self.num_nodes} nodes per sample, (S, n, d) or (S, H, W, d), "
                             f"got shape {features.shape}.")
        if len(labels) != len(features):
            raise ValueError(f"`labels` has {len(labels)} entries but `features` has {len(features)} samples.")
        if not np.all(np.isfinite(features)):
            raise ValueError("`features` hold NaN or Inf.")
        outside = sorted(set(labels.tolist()) - set(range(self.num_classes)))
        missing = sorted(set(range(self.num_classes)) - set(labels.tolist()))
        if missing or outside:
            raise ValueError(f"`labels` must contain every class in [0, {self.num_classes}) and no other; missing "
                             f"{missing}, outside {outside}.")
        if not self.built:
            self.build(features.shape)
        if features.shape[-1] != self.nodes.shape[-1]:
            raise ValueError(f"`features` have d = {features.shape[-1]} per node but the layer's nodes have "
                             f"d = {self.nodes.shape[-1]}.")
        means = np.stack([features[labels == k].mean(axis=0) for k in range(self.num_classes)])
        self.nodes.assign(means.astype(self.nodes.dtype))

    def call(self, inputs):
        return self.head([inputs, self.nodes])

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_classes)

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, num_nodes=self.num_nodes, head=dict(self.head_config),
                      initializer=keras.initializers.serialize(self.initializer))
        return config
