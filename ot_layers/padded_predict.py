"""``model.predict`` whose every batch gives each replica a share: batches padded to a multiple of the replicas.

Under data parallelism ``model.predict`` splits every batch over the replicas holding the model: the replicas of a
``tf.distribute`` strategy on TensorFlow (``model.distribute_strategy``), the devices of the batch axis of a
``keras.distribution`` (``DataParallel``) on JAX. A batch with fewer rows than replicas -- the last batch of
``N`` rows in batches of ``B`` when ``N % B`` is smaller than the replica count, e.g. 257 images in batches of 256
on 2 replicas -- leaves a replica an empty batch, on which oneDNN's CPU convolution returns its input unchanged and
the next convolution fails ("input depth must be evenly divisible by filter depth: 1 vs 8", an
``InvalidArgumentError`` deep inside Keras); JAX refuses any batch its devices do not divide (``IndivisibleError``).
The layer-state callbacks embed their images with ``predict`` after or before an epoch, so such a failure lost
the epoch's training.

:func:`predict_padded` predicts on in-memory arrays in batches of a multiple of the replica count: the batch size
rounded up to one, the last batch padded up to one with copies of its last row, whose outputs are dropped. A model
whose outputs for an example do not depend on the other examples of its batch (inference mode: the zoo's models)
gives the outputs of an unpadded ``predict``; on one replica (no strategy, one device, PyTorch) it *is*
``model.predict(x, batch_size=batch_size)``. :func:`pad_rows` and :func:`drop_padding` are its two halves, for a
caller whose batches come from elsewhere (``training.data.pipelines.predict_batches`` pads each batch of a
pipeline). Nothing here imports TensorFlow.
"""
import keras
import numpy as np

from ot_layers.validation import check_positive_int


def replica_count(model):
    """The replicas ``model.predict`` splits every batch over: its ``tf.distribute`` strategy's
    ``num_replicas_in_sync`` on TensorFlow (the strategy it was built under, else the one current when called: a
    model made outside a strategy's scope predicts on the current strategy), the devices along the batch axis of the
    active ``keras.distribution`` elsewhere (JAX's ``DataParallel``), else 1."""
    if keras.backend.backend() == "tensorflow":
        strategy = getattr(model, "distribute_strategy", None)
        return int(strategy.num_replicas_in_sync) if strategy is not None else 1
    return batch_devices(keras.distribution.distribution())


def batch_devices(distribution):
    """The devices ``distribution`` (a ``keras.distribution`` object, or ``None``) splits every batch over: the size
    of its device mesh along the batch axis (all of the mesh when it names none), 1 without a mesh."""
    mesh = getattr(distribution, "device_mesh", None)
    if mesh is None:
        return 1
    axis = getattr(distribution, "batch_dim_name", None)
    if axis in tuple(mesh.axis_names):
        return int(mesh.shape[tuple(mesh.axis_names).index(axis)])
    return int(np.prod(mesh.shape))


def padding_rows(rows, replicas):
    """How many rows a batch of ``rows`` needs to be a multiple of ``replicas`` (0 when it is one)."""
    return -int(rows) % int(replicas)


def _rows(x):
    """The number of rows of ``x`` (an array, or a list, tuple or dict of arrays of as many rows)."""
    counts = {len(leaf) for leaf in keras.tree.flatten(x)}
    if len(counts) != 1:
        raise ValueError(f"`x`: its arrays must have as many rows each, got {sorted(counts)}.")
    return counts.pop()


def pad_rows(x, replicas):
    """``x`` (a NumPy array, or a list, tuple or dict of them, as many rows each) with copies of its last row
    appended until its row count is a multiple of ``replicas``; ``x`` itself when it is one (or has no rows)."""
    rows = _rows(x)
    missing = padding_rows(rows, replicas)
    if not rows or not missing:
        return x
    return keras.tree.map_structure(lambda a: np.concatenate([a, np.repeat(a[-1:], missing, axis=0)]), x)


def drop_padding(outputs, sizes, replicas):
    """The outputs of batches of ``sizes`` rows each padded by :func:`pad_rows` (``outputs``: ``predict``'s, the
    padded batches' rows one after the other; an array or a structure of them) without the padding rows."""
    sizes = [int(size) for size in sizes]
    if not any(padding_rows(size, replicas) for size in sizes):
        return outputs
    kept, start = [], 0
    for size in sizes:
        kept.append(np.arange(start, start + size))
        start += size + padding_rows(size, replicas)
    kept = np.concatenate(kept) if kept else np.zeros(0, np.int64)

    def select(array):
        array = np.asarray(array)
        if len(array) != start:
            raise ValueError(f"`outputs` has {len(array)} rows; batches of {sizes} rows padded for {replicas} "
                             f"replicas give {start}.")
        return array[kept]

    return keras.tree.map_structure(select, outputs)


def predict_padded(model, x, batch_size=256, verbose=0):
    """``model.predict(x, batch_size=batch_size)`` (``x``: a NumPy array, or a list, tuple or dict of them) on any
    number of replicas (:func:`replica_count`): in batches of ``batch_size`` rounded up to a multiple of the
    replicas, the last one padded up to a multiple with copies of its last row, whose outputs are dropped. The
    outputs are those of an unpadded ``predict`` for a model that computes each example on its own (see the module
    docstring); on one replica this is ``model.predict`` itself."""
    batch_size = check_positive_int("batch_size", batch_size)
    replicas = replica_count(model)
    if replicas == 1:
        return model.predict(x, batch_size=batch_size, verbose=verbose)
    batch_size += padding_rows(batch_size, replicas)
    rows = _rows(x)
    last = rows % batch_size
    if not last or not padding_rows(last, replicas):
        return model.predict(x, batch_size=batch_size, verbose=verbose)
    outputs = model.predict(pad_rows(x, replicas), batch_size=batch_size, verbose=verbose)
    return drop_padding(outputs, [batch_size] * (rows // batch_size) + [last], replicas)
