"""The layer a model builder makes for a head (or a retrieval pooling) and the keyword arguments it passes on to it.

A builder (:func:`zoo.image_classifier`, :func:`zoo.embedding_model`, :func:`zoo.few_shot_model`, and
:func:`zoo.build` through them) hands ``head_kwargs`` (``pooling_kwargs``) to the layer of the head it is asked for.
:class:`HeadLayer` names that layer and the arguments the builder sets itself, so that a misspelt or misplaced
argument is refused before anything is built, with the arguments the layer does take (Keras' own error names
neither the builder's argument nor the alternatives).
"""
import difflib
import inspect
from typing import NamedTuple

import keras

_PARAMETER_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _named_parameters(cls):
    return [p.name for p in inspect.signature(cls.__init__).parameters.values()
            if p.kind in _PARAMETER_KINDS and p.name != "self"]


class HeadLayer(NamedTuple):
    """``layer_class``, the layer a builder makes for one head name; ``set_by_model``, the arguments of it the builder
    sets from its own (e.g. ``Dense``'s ``units`` from ``num_classes``); the layer's ``name`` is always the
    builder's."""
    layer_class: type
    set_by_model: tuple = ()

    def arguments(self):
        """The keyword arguments the builder passes on: the layer's named constructor arguments, then Keras'
        ``Layer`` ones, less those the builder sets."""
        names = _named_parameters(self.layer_class)
        names += [name for name in _named_parameters(keras.layers.Layer) if name not in names]
        return [name for name in names if name not in self.set_by_model and name != "name"]

    def refusal(self, key):
        """``None`` when the builder may pass ``key`` to the layer; else why not, as a clause."""
        layer = self.layer_class.__name__
        if key == "name" or key in self.set_by_model:
            return f"the model sets {layer}'s `{key}` itself"
        taken = self.arguments()
        if key in taken:
            return None
        close = difflib.get_close_matches(key, taken, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        return f"{layer} takes no argument `{key}`{hint}; it takes {', '.join(taken)}"

    def first_refusal(self, keys):
        """The first of ``keys`` the builder may not pass to the layer and why (:meth:`refusal`), or ``None``."""
        for key in keys:
            reason = self.refusal(key)
            if reason is not None:
                return key, reason
        return None

    def check(self, argument, kwargs):
        """Every key of ``kwargs`` (the builder's ``argument``, a dict) must be one the layer takes from the builder;
        the first that is not is named in a ``ValueError``."""
        refused = self.first_refusal(kwargs)
        if refused is not None:
            raise ValueError(f"`{argument}`: {refused[1]}.")
