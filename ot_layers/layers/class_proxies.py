"""ClassProxies: learnable per-class vectors (proxies, class embeddings) held as Keras weights of a model."""
import keras

from ot_layers.validation import check_positive_int


@keras.saving.register_keras_serializable(package="ot_layers")
class ClassProxies(keras.layers.Layer):
    """Identity layer that owns the weight ``proxies`` of shape ``(num_classes, proxies_per_class, dim)``.

    Losses cannot own trainable weights in ``model.fit``; placing this layer in the model (``x = proxies(x)``)
    makes its weight part of ``model.trainable_weights`` while proxy losses (``ProxyNCAPlusPlusLoss``,
    ``ProxyAnchorLoss``) and the zero-shot loss (class embeddings ``Upsilon``) read it through ``loss.proxies``.
    Callbacks that re-initialize proxies (CCP, SPEC S4) assign to ``layer.proxies``, a ``keras.Variable``.
    ``dim``: taken from the input's last axis when ``None``; set it when the vectors live in another space than
    the layer's input (e.g. class embeddings predicted from GSP's pseudo-attributes).
    """

    def __init__(self, num_classes, proxies_per_class=1, dim=None, initializer="random_normal", **kwargs):
        super().__init__(**kwargs)
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.proxies_per_class = check_positive_int("proxies_per_class", proxies_per_class)
        self.dim = None if dim is None else check_positive_int("dim", dim)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        dim = self.dim if self.dim is not None else input_shape[-1]
        if dim is None:
            raise ValueError("ClassProxies needs `dim` or an input with a known last axis.")
        self.proxies = self.add_weight(name="proxies", shape=(self.num_classes, self.proxies_per_class, int(dim)),
                                       initializer=self.initializer, trainable=True)

    def call(self, inputs):
        return inputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, proxies_per_class=self.proxies_per_class, dim=self.dim,
                      initializer=keras.initializers.serialize(self.initializer))
        return config
