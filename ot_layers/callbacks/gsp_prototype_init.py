"""GSP prototype initialization: GAP warm-up, then greedy k-center on stored local features (GSP:
Gurbuz 2022, ch. 5; greedy k-center: ch. 3, Algorithm 2)."""
import warnings

import keras
import numpy as np

from ot_layers.layers.generalized_sum_pooling import GeneralizedSumPooling
from ot_layers.padded_predict import predict_padded
from ot_layers.solvers import greedy_k_center
from ot_layers.tensor_ops import find_layer, flatten_feature_map_np, layer_input_model
from ot_layers.validation import check_fits_model_inputs, check_image_array, check_positive_int, check_seed


class GSPPrototypeInit(keras.callbacks.Callback):
    """Warm up a ``GeneralizedSumPooling`` layer as global average pooling, then set its prototypes.

    During the first ``warmup_epochs`` epochs the layer's ``average_pooling_warmup`` flag is set, so it pools like
    GAP. After them (at the start of the first epoch when ``warmup_epochs=0``), the feature maps entering the layer
    are computed for ``images``, ``num_features`` of their local feature vectors are drawn (``seed``; the stored
    embeddings, 1024 for the authors), normalized like the layer's cost (``u / max(1, ||u||)``), and the
    ``num_prototypes`` prototypes are chosen among them by greedy k-center (``ot_layers.solvers.greedy_k_center``);
    then the flag is cleared.

    Every decision lives in the layer's non-trainable weights (``average_pooling_warmup``, ``warmup_epochs_done``,
    ``prototypes_initialized``), so a run interrupted after any epoch and resumed with
    ``keras.callbacks.BackupAndRestore`` (or from a checkpoint) continues the warm-up where it stopped and never
    re-initializes; a second ``fit`` does not repeat the warm-up either. Place this callback before
    ``BackupAndRestore`` / ``ModelCheckpoint`` so that an epoch's checkpoint holds that epoch's decision.

    ``layer_name``: the layer's name, or ``None`` for the only ``GeneralizedSumPooling`` in the model (found through
    nested models by ``ot_layers.tensor_ops.find_layer``). The layer's input is read, so the layer must be called in
    a Functional model. Non-finite images or features raise ``ValueError``, and so do ``images`` that do not fit the
    model's input or that give fewer local features than the layer has prototypes (``len(images)`` times the
    ``H x W``, or ``n``, of the layer's input, where its shape is known): both checked when training begins, not
    after the warm-up. A fit that ends inside the warm-up (as many warm-up epochs left as it runs) warns when its
    first epoch begins: the layer would pool like GAP to the end. The features are computed in batches of
    ``batch_size`` by ``ot_layers.padded_predict.predict_padded`` (on several replicas a last batch smaller than
    them is padded).
    """

    def __init__(self, images, layer_name=None, warmup_epochs=1, num_features=1024, seed=0, batch_size=256):
        super().__init__()
        self.images = check_image_array("images", images)
        self.layer_name = layer_name
        if isinstance(warmup_epochs, bool) or not isinstance(warmup_epochs, (int, np.integer)) or warmup_epochs < 0:
            raise ValueError(f"`warmup_epochs` must be an integer >= 0, got {warmup_epochs!r}.")
        self.warmup_epochs = int(warmup_epochs)
        self.num_features = check_positive_int("num_features", num_features)
        self.seed = check_seed("seed", seed)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self._first_epoch = False  # set when a fit begins: its first epoch checks whether it outlasts the warm-up

    def _layer(self):
        return find_layer(self.model, GeneralizedSumPooling, self.layer_name)

    @property
    def initialized(self):
        """Whether the layer's prototypes have been set (read from the layer's state)."""
        return bool(float(self._layer().prototypes_initialized.numpy()) > 0.5)

    def on_train_begin(self, logs=None):
        # a model without the layer, too few features (`num_features`, or `images` whose feature maps give fewer
        # local features than prototypes, where the layer's input shape is known) or images that do not fit the
        # model fail here, before any training (the features are computed after the warm-up)
        layer = self._layer()
        if float(layer.prototypes_initialized.numpy()) <= 0.5:
            if self.num_features < layer.num_prototypes:
                raise ValueError(f"`num_features` ({self.num_features}) must be at least the layer's "
                                 f"{layer.num_prototypes} prototypes.")
            check_fits_model_inputs("images", self.images, self.model)
            per_image = _local_features_per_image(layer)
            if per_image is not None and len(self.images) * per_image < layer.num_prototypes:
                raise ValueError(f"`images` give {len(self.images) * per_image} local features ({len(self.images)} "
                                 f"image(s) x {per_image}), fewer than the layer's {layer.num_prototypes} "
                                 f"prototypes.")
        self._first_epoch = True

    def _warn_if_the_fit_ends_in_the_warm_up(self, layer, epoch):
        """At the first epoch of a fit (when its first epoch index is known, a resumed fit's included)."""
        epochs = (self.params or {}).get("epochs")
        remaining = self.warmup_epochs - float(layer.warmup_epochs_done.numpy())
        if epochs is not None and remaining >= epochs - epoch:
            warnings.warn(f"GSPPrototypeInit: {remaining:g} warm-up epoch(s) remain and this fit runs "
                          f"{epochs - epoch}, so layer {layer.name!r} pools like global average pooling throughout "
                          "and its prototypes are never trained (set warmup_epochs below epochs, or fit again to go "
                          "on).")

    def on_epoch_begin(self, epoch, logs=None):
        layer = self._layer()
        if float(layer.prototypes_initialized.numpy()) > 0.5:
            return
        if self._first_epoch:
            self._warn_if_the_fit_ends_in_the_warm_up(layer, epoch)
        self._first_epoch = False
        if float(layer.warmup_epochs_done.numpy()) >= self.warmup_epochs:
            self.initialize_prototypes(layer)
        else:
            layer.average_pooling_warmup.assign(1.0)

    def on_epoch_end(self, epoch, logs=None):
        layer = self._layer()
        if float(layer.prototypes_initialized.numpy()) > 0.5:
            return
        layer.warmup_epochs_done.assign_add(1.0)
        if float(layer.warmup_epochs_done.numpy()) >= self.warmup_epochs:
            self.initialize_prototypes(layer)

    def initialize_prototypes(self, layer=None):
        """Greedy k-center prototypes from the current local features of ``images``; clears the warm-up flag."""
        layer = self._layer() if layer is None else layer
        feature_model = layer_input_model(self.model, layer)
        features = flatten_feature_map_np(predict_padded(feature_model, self.images, self.batch_size))
        if not np.all(np.isfinite(features)):
            raise ValueError("`images`: the features entering the GeneralizedSumPooling layer hold NaN or Inf.")
        rng = np.random.default_rng(self.seed)
        stored = features[rng.choice(len(features), size=min(self.num_features, len(features)), replace=False)]
        stored = stored / np.maximum(1.0, np.linalg.norm(stored, axis=1, keepdims=True))
        if len(stored) < layer.num_prototypes:
            raise ValueError(f"`images` give {len(stored)} local features, fewer than the layer's "
                             f"{layer.num_prototypes} prototypes.")
        chosen = greedy_k_center(stored, layer.num_prototypes, seed=self.seed)
        layer.prototypes.assign(stored[chosen].astype(layer.prototypes.dtype))
        layer.average_pooling_warmup.assign(0.0)
        layer.prototypes_initialized.assign(1.0)


def _local_features_per_image(layer):
    """The local features one image gives the layer: the product of its input's static spatial axes (``H x W`` of
    ``(B, H, W, d)``, ``n`` of ``(B, n, d)``); None where the layer's input or one of those axes is unknown."""
    try:
        shape = tuple(layer.input.shape)
    except (AttributeError, ValueError):  # not called in a functional graph
        return None
    spatial = shape[1:-1]
    if not spatial or any(axis is None for axis in spatial):
        return None
    return int(np.prod(spatial))
