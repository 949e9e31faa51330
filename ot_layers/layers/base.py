"""The base of the layers that say whether they export: :class:`ExportableLayer`.

Every ``ot_layers`` layer states whether a model holding it can be exported to SavedModel and ONNX through one
property, ``export_blocker``: ``None`` when it exports, else one sentence saying why not and naming the exportable
alternative. ``export.signatures.refuse_unexportable`` reads it on every layer of a model
(``ot_layers.tensor_ops.walk_layers``) and raises with that sentence before anything is written.

A layer sets the class attribute :attr:`ExportableLayer.EXPORT_BLOCKER` when the answer never changes (e.g.
``ManifoldProxies``), or overrides :meth:`ExportableLayer._export_blocker_reason` when it depends on the layer's
arguments (e.g. ``EMDHead(method="exact")``). The default, ``None``, means "exports".
"""
import keras


class ExportableLayer(keras.layers.Layer):
    """A Keras layer with an ``export_blocker`` (see the module docstring)."""

    EXPORT_BLOCKER = None  # the reason, for a layer that never exports; None: the layer exports
    ITERATIVE = False  # True for a layer that runs a solver's loop (Sinkhorn, partial transport) in its call

    @property
    def supports_jit(self):
        """Keras' flag: whether ``jit_compile`` may compile a model holding this layer. Never on PyTorch for an
        :attr:`ITERATIVE` layer: Keras hands a model compiled with ``jit_compile=True`` to ``torch.compile``, which
        failed on the solver loop's graph break once the batch size changed (a last, smaller batch) and retraces the
        loop for every iteration count; so Keras runs it eagerly (``jit_compile="auto"`` does already; ``True``
        warns and proceeds without, also for a ``.keras`` file compiled on another backend)."""
        return self._supports_jit and not (self.ITERATIVE and keras.backend.backend() == "torch")

    @supports_jit.setter
    def supports_jit(self, value):
        self._supports_jit = bool(value)

    def _export_blocker_reason(self):
        """The reason this layer does not export (naming the alternative), or ``None``; default
        :attr:`EXPORT_BLOCKER`."""
        return self.EXPORT_BLOCKER

    @property
    def export_blocker(self):
        """``None`` when the layer exports to SavedModel and ONNX, else why not (one sentence naming the exportable
        alternative)."""
        return self._export_blocker_reason()
