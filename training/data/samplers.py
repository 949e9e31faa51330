"""Class-balanced batches for metric learning: ``P`` classes x ``K`` samples per class in every batch."""
import keras
import numpy as np

from ot_layers.validation import check_class_ids, check_positive_int, check_seed


def class_balanced_indices(labels, classes_per_batch, samples_per_class, rng):
    """Indices of one batch: ``classes_per_batch`` distinct classes drawn uniformly, ``samples_per_class`` each.

    Samples are drawn without replacement inside a class when it has enough of them, with replacement otherwise.
    Returns an int64 array of length ``classes_per_batch * samples_per_class``, grouped by class. ``rng``: a
    ``numpy.random.Generator`` (``numpy.random.default_rng(seed)``).
    """
    labels = check_class_ids(labels, "labels")
    classes_per_batch = check_positive_int("classes_per_batch", classes_per_batch)
    samples_per_class = check_positive_int("samples_per_class", samples_per_class)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"`rng` must be a numpy.random.Generator (numpy.random.default_rng(seed)), got "
                         f"{type(rng).__name__}.")
    members = class_members(labels, classes_per_batch)
    return _draw_batch(members, classes_per_batch, samples_per_class, rng)


def class_members(labels, classes_per_batch):
    """``{class: indices}`` of checked ``labels``, in increasing class order; a ``ValueError`` when there are fewer
    classes than ``classes_per_batch``."""
    classes = np.unique(labels)
    if classes_per_batch > len(classes):
        raise ValueError(f"`classes_per_batch` ({classes_per_batch}) exceeds the number of classes ({len(classes)}).")
    return {c: np.flatnonzero(labels == c) for c in classes}


def _draw_batch(members, classes_per_batch, samples_per_class, rng):
    """One batch from ``members`` (:func:`class_members`): the draws of :func:`class_balanced_indices`."""
    chosen = rng.choice(np.array(list(members)), size=classes_per_batch, replace=False)
    batch = [rng.choice(members[c], size=samples_per_class, replace=len(members[c]) < samples_per_class)
             for c in chosen]
    return np.concatenate(batch).astype(np.int64)


class FitEpochs:
    """The ``epoch`` of seeded batches (``ClassBalancedBatches``, ``training.data.arrays.ArrayBatches``), advanced
    by ``on_epoch_end`` at the end of every pass, so that a plain ``fit`` trains its epoch ``e`` on epoch ``e``'s
    batches.

    Keras also calls ``on_epoch_end`` before the first epoch of ``fit`` (and ``evaluate``), after reading a batch or
    two to build the model; counted as a pass, it made a plain ``fit`` skip epoch 0. Hence two rules: an
    ``on_epoch_end`` with no ``on_epoch_begin`` since the last one (that reset, or a direct call) advances, but a
    following ``on_epoch_begin`` (a ``fit`` epoch starting) takes it back; after an ``on_epoch_begin``, an
    ``on_epoch_end`` advances only once every batch was served (the build on JAX and PyTorch begins, reads one
    batch and ends; ``fit``'s ``steps_per_epoch`` below the batch count serves a pass in parts). Where the batches
    read before training can make up a whole pass, the rules cannot tell it from one: a one-batch data set on JAX
    and PyTorch, a few batches read ahead under a ``tf.distribute`` strategy; Keras' ``workers`` read ahead too,
    and with ``use_multiprocessing`` the batches are served in other processes. There, and to resume runs, pass
    ``epoch_callback()`` to ``fit``, which sets ``epoch`` from ``fit``'s own counter (``training.distributed.fit``
    does). Subclasses call :meth:`_served_batch` for every batch
    they serve and :meth:`_new_pass` in ``set_epoch``."""

    def _new_pass(self):
        self._served, self._begun, self._taken_back = set(), False, False

    def _served_batch(self, index):
        self._served.add(index)

    def on_epoch_begin(self):
        if self._taken_back:  # the on_epoch_end before was Keras' reset before this fit epoch, not a pass
            self.set_epoch(self.epoch - 1)
        self._begun = True

    def on_epoch_end(self):
        begun, self._begun = self._begun, False
        if begun and 0 < len(self._served) < len(self):
            return
        self.set_epoch(self.epoch + 1)
        self._taken_back = not begun


class EpochSync(keras.callbacks.Callback):
    """Tells seeded batches (``ClassBalancedBatches``, ``training.data.arrays.ArrayBatches``: anything with
    ``set_epoch``) the epoch ``fit`` is in, which ``BackupAndRestore`` restores on resume."""

    def __init__(self, batches):
        super().__init__()
        self.batches = batches

    def on_epoch_begin(self, epoch, logs=None):
        self.batches.set_epoch(epoch)


class ClassBalancedBatches(FitEpochs, keras.utils.PyDataset):
    """``model.fit`` input yielding ``steps_per_epoch`` batches ``(x[idx], y[idx])`` of ``P x K`` samples.

    Each batch holds ``classes_per_batch`` (P) classes with ``samples_per_class`` (K) samples each. The batches of
    epoch ``e`` are a deterministic function of ``(seed, e)`` (drawn from ``numpy.random.default_rng([seed, e])``),
    so the data order carries no hidden state. ``epoch`` advances at the end of every pass (:class:`FitEpochs`: a
    plain ``fit`` serves epoch ``e`` in its epoch ``e``); for runs resumed with
    ``keras.callbacks.BackupAndRestore`` pass ``batches.epoch_callback()`` to ``fit`` as well, which sets ``epoch``
    from ``fit``'s (restored) epoch counter at the start of every epoch, and call ``fit(..., shuffle=False)`` (the
    batches are already random; Keras would shuffle their order with Python's ``random``, whose state a resumed
    run does not restore).
    """

    def __init__(self, x, y, classes_per_batch, samples_per_class, steps_per_epoch, seed=0, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = np.asarray(x), check_class_ids(y, "y")  # a list is indexed by arrays too
        if len(self.x) != len(self.y):
            raise ValueError(f"`x` has {len(self.x)} samples but `y` has {len(self.y)}.")
        self.classes_per_batch = check_positive_int("classes_per_batch", classes_per_batch)
        self.samples_per_class = check_positive_int("samples_per_class", samples_per_class)
        self.steps_per_epoch = check_positive_int("steps_per_epoch", steps_per_epoch)
        self._members = class_members(self.y, self.classes_per_batch)  # checked and grouped once, not every batch
        self.seed = check_seed("seed", seed)
        self._drawn_epoch, self.batches = None, None
        self.set_epoch(0)

    def batches_of_epoch(self, epoch):
        """The ``steps_per_epoch`` index arrays of ``epoch`` (a pure function of ``(seed, epoch)``)."""
        rng = np.random.default_rng([self.seed, int(epoch)])
        return [_draw_batch(self._members, self.classes_per_batch, self.samples_per_class, rng)
                for _ in range(self.steps_per_epoch)]

    def _draw(self):
        if self._drawn_epoch != self.epoch:
            self.batches, self._drawn_epoch = self.batches_of_epoch(self.epoch), self.epoch

    def set_epoch(self, epoch):
        """Serve the batches of ``epoch`` from now on."""
        self.epoch = int(epoch)
        self._new_pass()
        self._draw()

    def epoch_callback(self):
        """A ``keras.callbacks.Callback`` that calls ``set_epoch`` with ``fit``'s epoch at every epoch start."""
        return EpochSync(self)

    def __len__(self):
        return self.steps_per_epoch

    def batch_sizes(self):
        """The size every batch has: ``{classes_per_batch * samples_per_class}``."""
        return {self.classes_per_batch * self.samples_per_class}

    def __getitem__(self, index):
        idx = self.batches[index]
        self._served_batch(index)
        return self.x[idx], self.y[idx]
