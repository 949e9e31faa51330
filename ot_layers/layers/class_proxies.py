"""ClassProxies: learnable per-class vectors (proxies, class embeddings) held as a Keras weight of the model, and the
output the proxy losses read (Gurbuz 2022, ch. 3 and 5)."""
import keras
from keras import ops

from ot_layers.layers.base import ExportableLayer
from ot_layers.layers.weight_initializer import resolve_initializer
from ot_layers.tensor_ops import normalize_rows
from ot_layers.validation import check_choice, check_positive_int, check_rank

OUTPUTS = ("similarities", "packed")


@keras.saving.register_keras_serializable(package="ot_layers")
class ClassProxies(ExportableLayer):
    """Owns the weight ``proxies`` ``(num_classes, num_proxies, dim)`` and outputs what a proxy loss needs.

    Losses cannot own trainable weights in ``model.fit``; placing this layer in the model makes its weight part of
    ``model.trainable_weights``, and its output carries everything the loss needs, so that the losses are plain
    functions of ``(y_true, y_pred)`` (they survive a ``.keras`` round trip and run under any strategy):

    - ``output="similarities"`` (default): the cosine similarities ``s_bkm = <x̂_b, p̂_km>`` ``(B, num_classes,
      num_proxies)`` of the L2-normalized inputs to the L2-normalized proxies, for ``ProxyAnchorLoss`` and
      ``ProxyNCAPlusPlusLoss``. The embedding for retrieval is the layer's input: use
      ``keras.Model(model.inputs, layer.input)``.
    - ``output="packed"``: ``(B, 1 + num_classes, D)`` with ``D = max(input dim, dim)``: row 0 the input vector,
      rows ``1 + k`` the class embeddings ``p_k0`` (the same for every sample), zero-padded to width ``D`` (padding
      changes no inner product). For ``ZeroShotPredictionLoss``, whose class embeddings ``Upsilon`` (``dim = dv``)
      live in another space than the pseudo-attributes ``z``. One embedding per class: ``num_proxies`` other than 1
      is refused (the loss would read every proxy row as a class of its own).

    Both outputs are computed and returned in float32 (the variable dtype), like a final softmax under mixed
    precision. Callbacks reach the proxies through the layer (``ot_layers.tensor_ops.find_layer``) and re-assign
    ``layer.proxies`` (CCP). ``dim``: taken from the input's last axis when ``None``.
    """

    def __init__(self, num_classes, num_proxies=1, dim=None, initializer="random_normal", output="similarities",
                 **kwargs):
        super().__init__(**kwargs)
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.num_proxies = check_positive_int("num_proxies", num_proxies)
        self.dim = None if dim is None else check_positive_int("dim", dim)
        self.initializer = resolve_initializer("initializer", initializer)
        self.output_mode = check_choice("output", output, OUTPUTS)
        if self.output_mode == "packed" and self.num_proxies != 1:
            raise ValueError(f"`num_proxies` must be 1 for output='packed' (one class embedding per class, as "
                             f"ZeroShotPredictionLoss reads rows 1..num_classes), got {self.num_proxies}.")

    def build(self, input_shape):
        check_rank("inputs", input_shape, (2,))  # (batch, dim) embeddings
        dim = self.dim if self.dim is not None else input_shape[-1]
        if dim is None:
            raise ValueError("`dim`: ClassProxies needs `dim` or an input with a known last axis.")
        if self.output_mode == "packed" and input_shape[-1] is None:
            raise ValueError("`inputs`: output='packed' needs the embeddings' last axis known (it sets the packed "
                             "width), got an input of shape " + str(tuple(input_shape)) + ".")
        if self.output_mode == "similarities" and input_shape[-1] is not None and int(input_shape[-1]) != int(dim):
            raise ValueError(f"`dim` ({dim}) must equal the input's last axis ({input_shape[-1]}) for "
                             "output='similarities'; use output='packed' for vectors of another space.")
        self.proxies = self.add_weight(name="proxies", shape=(self.num_classes, self.num_proxies, int(dim)),
                                       initializer=self.initializer, trainable=True,
                                       autocast=False)  # read in float32 under mixed precision
        if self.output_mode == "similarities":
            self.input_spec = keras.layers.InputSpec(axes={-1: int(dim)})  # another dim later: one error line

    def call(self, inputs):
        x = ops.cast(inputs, self.variable_dtype)
        proxies = ops.convert_to_tensor(self.proxies)
        if self.output_mode == "similarities":
            return ops.einsum("bd,kmd->bkm", normalize_rows(x), normalize_rows(proxies))
        width = max(int(x.shape[-1]), int(proxies.shape[-1]))
        x = ops.pad(x, [[0, 0], [0, width - int(x.shape[-1])]])[:, None, :]
        flat = ops.reshape(proxies, (self.num_classes * self.num_proxies, proxies.shape[-1]))
        flat = ops.pad(flat, [[0, 0], [0, width - int(proxies.shape[-1])]])
        flat = ops.broadcast_to(flat[None], (ops.shape(x)[0], flat.shape[0], width))
        return ops.concatenate([x, flat], axis=1)

    def compute_output_shape(self, input_shape):
        if self.output_mode == "similarities":
            return (input_shape[0], self.num_classes, self.num_proxies)
        dim = self.dim if self.dim is not None else input_shape[-1]
        return (input_shape[0], 1 + self.num_classes * self.num_proxies, max(int(input_shape[-1]), int(dim)))

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype=self.variable_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(num_classes=self.num_classes, num_proxies=self.num_proxies, dim=self.dim,
                      initializer=keras.initializers.serialize(self.initializer), output=self.output_mode)
        return config
