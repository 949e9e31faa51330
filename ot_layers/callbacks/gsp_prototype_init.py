"""GSP prototype initialization: GAP warm-up, then greedy k-center on stored local features (paper 003, ch. 5)."""
import keras
import numpy as np

from ot_layers.solvers import greedy_k_center
from ot_layers.validation import check_positive_int


class GSPPrototypeInit(keras.callbacks.Callback):
    """Warm up a ``GeneralizedSumPooling`` layer as global average pooling, then set its prototypes.

    At the start of training the layer's ``average_pooling_warmup`` flag is set, so it pools like GAP. After
    ``warmup_epochs`` epochs (immediately when 0), the feature maps entering the layer are computed for
    ``images``, ``num_features`` of their local feature vectors are drawn (the stored embeddings; the authors use
    1024), normalized like the layer's cost (``u / max(1, ||u||)``), and the ``num_prototypes`` prototypes are chosen
    among them by greedy k-center (``ot_layers.solvers.greedy_k_center``); then the flag is cleared.
    ``layer``: the layer or its name in the model. Needs a Functional model (the layer's input is read).
    """

    def __init__(self, layer, images, warmup_epochs=1, num_features=1024, seed=0, batch_size=256):
        super().__init__()
        self.layer_or_name = layer
        self.images = images
        self.warmup_epochs = int(warmup_epochs)
        if self.warmup_epochs < 0:
            raise ValueError(f"`warmup_epochs` must be an integer >= 0, got {warmup_epochs!r}.")
        self.num_features = check_positive_int("num_features", num_features)
        self.seed = seed
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.initialized = False

    def _layer(self):
        if isinstance(self.layer_or_name, str):
            return self.model.get_layer(self.layer_or_name)
        return self.layer_or_name

    def on_train_begin(self, logs=None):
        if self.initialized:
            return
        if self.warmup_epochs == 0:
            self.initialize_prototypes()
        else:
            self._layer().average_pooling_warmup.assign(1.0)

    def on_epoch_end(self, epoch, logs=None):
        if not self.initialized and epoch + 1 >= self.warmup_epochs:
            self.initialize_prototypes()

    def initialize_prototypes(self):
        layer = self._layer()
        feature_model = keras.Model(self.model.inputs, layer.input)
        features = np.asarray(feature_model.predict(self.images, batch_size=self.batch_size, verbose=0))
        features = features.reshape(-1, features.shape[-1]).astype(np.float64)
        rng = np.random.default_rng(self.seed)
        stored = features[rng.choice(len(features), size=min(self.num_features, len(features)), replace=False)]
        stored = stored / np.maximum(1.0, np.linalg.norm(stored, axis=1, keepdims=True))
        if len(stored) < layer.num_prototypes:
            raise ValueError(f"`images` give {len(stored)} local features, fewer than the layer's "
                             f"{layer.num_prototypes} prototypes.")
        chosen = greedy_k_center(stored, layer.num_prototypes, seed=self.seed)
        layer.prototypes.assign(stored[chosen].astype(layer.prototypes.dtype))
        layer.average_pooling_warmup.assign(0.0)
        self.initialized = True
