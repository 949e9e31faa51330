"""The ``initializer`` argument of the layers with trainable weights of their own (``MultiProxyWasserstein``,
``GeneralizedSumPooling``, ``ClassProxies``, ``StructuredFC``)."""
import keras


def resolve_initializer(name, value):
    """``keras.initializers.get(value)`` for a layer's argument ``name``: a Keras initializer, its name or its
    config. ``None``, which Keras would replace by its generic default (``glorot_uniform``, whose spread depends on
    the weight's shape) rather than the layer's, and an identifier Keras cannot read are refused naming ``name``."""
    if value is None:
        raise ValueError(f"`{name}` must be a Keras initializer, its name or its config, got None (leave the "
                         "argument out for the layer's default).")
    try:
        return keras.initializers.get(value)
    except ValueError as error:
        raise ValueError(f"`{name}`: {error}.") from None
