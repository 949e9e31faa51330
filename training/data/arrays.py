"""Batches of in-memory image arrays for every Keras backend: a ``keras.utils.PyDataset`` in NumPy, with the
pad-crop-flip augmentation (or none).

On the TensorFlow backend the recipes read arrays through ``tf.data`` (``training.data.pipelines``); on JAX and
PyTorch through :class:`ArrayBatches`, which needs no TensorFlow (the machines those backends run on may lack it).
Both give the same batches: ``(float32 pixels in 0-255, int32 labels)``, shuffled and augmented every epoch when
training, the last incomplete batch dropped. The random draws differ (NumPy's generator, not TensorFlow's stateless
ops), so the two orders are not the same sequence; each is reproducible from its seed.
"""
import keras
import numpy as np

from ot_layers.validation import check_flag, check_labels, check_non_negative_int, check_positive_int, check_seed
from training.data.samplers import EpochSync, FitEpochs

# The training augmentations of in-memory arrays, by the name a recipe's ``augment`` gives.
AUGMENTATIONS = ("pad_crop_flip", "none")


def check_augmentation(augment, accepted=AUGMENTATIONS, where="in-memory image arrays"):
    """``augment`` if it is one of ``accepted``, else a ``ValueError`` naming the recipe field."""
    if augment not in accepted:
        raise ValueError(f"recipe field `augment` must be one of {list(accepted)} for {where}, got {augment!r}.")
    return augment


def check_arrays(images, labels):
    """A ``ValueError`` when ``images`` and ``labels`` differ in length or hold no sample, or ``labels`` are no
    integer class labels (:func:`check_labels`)."""
    if len(images) != len(labels):
        raise ValueError(f"`images` has {len(images)} samples but `labels` has {len(labels)}.")
    if len(images) == 0:
        raise ValueError("`images` is empty: the data slice holds no samples.")
    check_labels(labels)


def check_batching(images, labels, batch_size, training, pad, seed, drop_remainder):
    """The checked arguments ``(batch_size, training, pad, seed, drop)`` of a pipeline of in-memory arrays
    (:class:`ArrayBatches`, ``training.data.pipelines.image_dataset``); ``drop``: whether the last incomplete batch
    is dropped (by default when training). ``images`` must be ``(N, H, W, C)``. A training pipeline that would make no batch (``batch_size`` above the
    number of samples, the remainder dropped) is a ``ValueError``: ``fit`` would train on nothing without a word."""
    batch_size = check_positive_int("batch_size", batch_size)
    training = check_flag("training", training)
    pad, seed = check_non_negative_int("pad", pad), check_seed("seed", seed)
    drop = training if drop_remainder is None else check_flag("drop_remainder", drop_remainder)
    check_arrays(images, labels)
    if np.ndim(images) != 4:  # grayscale (N, H, W) failed at the first batch, in NumPy's or TensorFlow's words
        raise ValueError(f"`images` must have shape (N, H, W, C), got shape {np.shape(images)}"
                         f"{' (add the channel axis: images[..., None])' if np.ndim(images) == 3 else ''}.")
    if drop and batch_size > len(images):
        raise ValueError(f"`batch_size` ({batch_size}) exceeds the {len(images)} samples and the last incomplete "
                         "batch is dropped: there would be no batch; lower it or pass drop_remainder=False.")
    return batch_size, training, pad, seed, drop


def pad_crop_flip_batch(images, pad, rng):
    """Each image of ``images`` ``(B, H, W, C)`` zero-padded by ``pad`` pixels on each side, cropped back to
    ``H x W`` at a random place and flipped left-right with probability 1/2 (the CIFAR augmentation of He et al.
    2016), with the draws of NumPy generator ``rng``."""
    batch, height, width = images.shape[:3]
    padded = np.pad(images, [(0, 0), (pad, pad), (pad, pad), (0, 0)])
    rows = rng.integers(0, 2 * pad + 1, size=batch)
    cols = rng.integers(0, 2 * pad + 1, size=batch)
    flips = rng.random(batch) < 0.5
    out = np.empty_like(images)
    for i in range(batch):
        crop = padded[i, rows[i]:rows[i] + height, cols[i]:cols[i] + width]
        out[i] = crop[:, ::-1] if flips[i] else crop
    return out


class ArrayBatches(FitEpochs, keras.utils.PyDataset):
    """Batches of ``(float32 pixels in 0-255, int32 labels)`` from arrays ``images (N, H, W, C)``, ``labels (N,)``,
    passed through ``feed(x, y)`` (the recipe's batch feed; default ``(x, y)``).

    With ``training``: a new seeded order every epoch, each batch augmented by ``augment`` (``"pad_crop_flip"`` with
    ``pad`` pixels, or ``"none"``), the last incomplete batch dropped unless ``drop_remainder=False``. Epoch ``e``
    draws its order and augmentation from ``numpy.random.default_rng([seed, e, ...])``, a pure function of
    ``(seed, e)``: ``epoch`` advances at the end of every pass (``training.data.samplers.FitEpochs``: a plain
    ``fit`` serves epoch ``e`` in its epoch ``e``), and :meth:`epoch_callback` sets it from ``fit``'s own
    epoch counter at the start of every epoch, so a run resumed from a backup draws the batches an uninterrupted run
    would (``training.distributed.fit`` adds that callback, and ``shuffle=False``, by itself). Without
    ``training``: the arrays in order, every sample kept.
    :meth:`map` gives the same batches through another feed, as ``tf.data.Dataset.map`` does.
    """

    def __init__(self, images, labels, batch_size, training=False, pad=2, seed=0, drop_remainder=None,
                 augment="pad_crop_flip", feed=None):
        super().__init__()
        self.augment = check_augmentation(augment)
        self.batch_size, self.training, self.pad, self.seed, self.drop_remainder = check_batching(
            images, labels, batch_size, training, pad, seed, drop_remainder)
        self.images, self.labels, self.feed = np.asarray(images), np.asarray(labels), feed
        self.epoch, self._ordered_epoch = 0, None
        self.set_epoch(0)

    def set_epoch(self, epoch):
        """Serve the batches of ``epoch`` from now on."""
        self.epoch = int(epoch)
        self._new_pass()
        if self._ordered_epoch != self.epoch:
            self._order = (np.random.default_rng([self.seed, self.epoch]).permutation(len(self.labels))
                           if self.training else np.arange(len(self.labels)))
            self._ordered_epoch = self.epoch

    def epoch_callback(self):
        """A ``keras.callbacks.Callback`` that calls :meth:`set_epoch` with ``fit``'s epoch at every epoch start
        (pass it to ``fit`` with ``shuffle=False``: Keras would otherwise reorder the batches with Python's
        ``random``, whose state a resumed run does not restore)."""
        return EpochSync(self)

    def __len__(self):
        full, rest = divmod(len(self.labels), self.batch_size)
        return full if self.drop_remainder or not rest else full + 1

    def batch_sizes(self):
        """The sizes the batches have: ``batch_size`` (if there is a full batch), and the last one's where it is
        kept and smaller."""
        full, rest = divmod(len(self.labels), self.batch_size)
        return ({self.batch_size} if full else set()) | ({rest} if rest and not self.drop_remainder else set())

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        self._served_batch(index)
        chosen = self._order[index * self.batch_size:(index + 1) * self.batch_size]
        x = self.images[chosen].astype(np.float32)
        if self.training and self.augment == "pad_crop_flip":
            x = pad_crop_flip_batch(x, self.pad, np.random.default_rng([self.seed, self.epoch, index]))
        y = self.labels[chosen].astype(np.int32)
        return self.feed(x, y) if self.feed is not None else (x, y)

    def map(self, feed):
        """The same batches passed through ``feed(x, y)`` after this one's feed."""
        inner = self.feed
        mapped = ArrayBatches.__new__(ArrayBatches)
        mapped.__dict__.update(self.__dict__)
        mapped._served = set(self._served)  # its own record of the batches it served
        mapped.feed = feed if inner is None else (lambda x, y: feed(*inner(x, y)))
        return mapped
