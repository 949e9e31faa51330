"""``training.distributed.fit``: one call that trains a compiled Keras model under any ``tf.distribute`` strategy.

Under the default, ``OneDeviceStrategy``, ``MirroredStrategy`` and ``TPUStrategy`` it is ``model.fit``. Under
``MultiWorkerMirroredStrategy`` Keras 3.15's ``model.fit`` fails (it cannot reduce the per-replica logs:
"Attempt to convert a value (PerReplica...)", keras-team/keras#20585), so :func:`fit` runs this module's own loop
(:func:`distributed_fit`): every step is ``strategy.run(model.train_step, ...)`` on a batch of the distributed
dataset -- the model's own forward pass, compiled loss (with the layers' and the weight regularizers' losses), its
Keras optimizer (which all-reduces the gradients across replicas and workers) and compiled metrics -- and the logs
are the metrics read in cross-replica context (summed over every replica of every worker). The loop drives the
standard callback hooks (``on_train_begin``, ``on_epoch_begin``, ``on_train_batch_begin/end``, ``on_epoch_end``,
``on_train_end``) with the same logs ``model.fit`` gives, so the layers' state callbacks, ``EarlyStopping``,
``TensorBoard``, ``ProgbarLogger``, ``CSVLogger`` and checkpoints work unchanged.

Usage: the model must be built and compiled under the strategy's scope (its variables are placed, mirrored, when
they are created). Either pass a build function, which :func:`fit` calls under the scope::

    def build():
        model = zoo.image_classifier("small_convnet", "mpw", 10, input_shape=(28, 28, 1))
        model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model

    model, history = training.distributed.fit(build, dataset, epochs=3, strategy="auto", checkpoint_dir="run/backup")

or build it yourself::

    strategy = training.distributed.make_strategy("multi_worker")  # first thing in the program
    with strategy.scope():
        model = build()
    model, history = training.distributed.fit(model, dataset, epochs=3)  # the model's own strategy

Batches: ``data`` yields *global* batches ``(x, y)`` or ``(x, y, sample_weight)``; each of the
``strategy.num_replicas_in_sync`` replicas gets ``global_batch / num_replicas_in_sync`` examples (so the global
batch must be divisible by it; batch with ``drop_remainder=True``). A batch with fewer examples than replicas (a
last, smaller one) is refused before training (:class:`EmptyReplicaError`): a replica would get an empty batch.
With several workers ``tf.data`` auto-sharding splits every global batch among the workers, so a run on N workers
follows the same data order and the same global batches as one process would.

Fault tolerance: ``checkpoint_dir`` backs up the training state (``training.distributed.checkpoints``, atomic
writes) every epoch, or every ``save_freq`` batches, restores it when the run starts again and deletes it when
training finishes (``keras.callbacks.BackupAndRestore`` semantics). A ``keras.callbacks.BackupAndRestore`` in
``callbacks`` is replaced by the same mechanism (its ``backup_dir`` and ``save_freq``). The multi-worker loop
resumes mid-epoch exactly: the batches already done are skipped (it saves its position in the data), the epoch's
loss and metric totals so far are restored (its logs cover all its batches), and so are ``EarlyStopping``'s
counters and best weights and the layers' random-generator states (``Dropout``'s). Under ``model.fit`` a plain
``BackupAndRestore`` becomes an ``AtomicBackupAndRestore`` on the same directory (which also keeps the generators'
states). A backup directory written by the other trainer is refused (``OtherTrainerError``).

Data: a ``tf.data.Dataset`` is read as ``model.fit`` reads it, through one iterator kept across epochs and started
again once the dataset is exhausted: with ``steps_per_epoch`` an epoch continues where the previous one stopped (on
a repeated dataset every epoch gets new batches), and an epoch that reaches the end of a finite dataset ends there.
A function ``epoch -> Dataset`` gives each epoch a dataset of its own.
"""
import collections
import warnings

import keras

from ot_layers.optional import AbsentModule, tensorflow_if_installed
from ot_layers.padded_predict import batch_devices
from ot_layers.validation import check_output_path, check_positive_int
from training.distributed.checkpoints import AtomicBackupAndRestore, TrainingCheckpoint
from training.distributed.keras_distribution import UnevenSplitError, keras_distribution
from training.distributed.strategies import is_chief, make_strategy, strategy_name

tf = tensorflow_if_installed("tf.distribute training")

# Callbacks that write files or print: under several workers only the chief runs them (each worker would
# otherwise write the same files).
CHIEF_ONLY_CALLBACKS = (keras.callbacks.TensorBoard, keras.callbacks.ModelCheckpoint, keras.callbacks.CSVLogger,
                        keras.callbacks.ProgbarLogger)


class EmptyReplicaError(UnevenSplitError):
    """A batch with fewer examples than the ``tf.distribute`` strategy's replicas: some replica would get an empty
    batch, which not every TensorFlow op takes (oneDNN's convolution on CPUs returns an empty input unchanged, and
    the next convolution fails on its channels, deep inside ``fit``: for a last, smaller validation batch, after the
    first epoch's training). Checked before training; ``otzoo`` prints it in one line."""


def resolve_model(model, strategy="auto"):
    """``(strategy, model)``: ``model`` is a compiled Keras model built under the strategy it is trained with, or a
    zero-argument function building and compiling one, called here under ``make_strategy(strategy).scope()``.

    With a model, ``strategy="auto"`` means the model's own strategy; another name must match it (a model's
    variables cannot move to another strategy), else ``ValueError`` naming ``strategy``.
    """
    if not isinstance(model, keras.Model):
        if not callable(model):
            raise ValueError(f"`model` must be a compiled keras.Model or a function building one, got {model!r}.")
        strategy = make_strategy(strategy)
        with strategy.scope():
            built = model()
        if not isinstance(built, keras.Model):
            raise ValueError(f"`model`: the build function returned {type(built).__name__}, not a keras.Model.")
        model = built
        _check_compiled(model)
        return strategy, model
    _check_compiled(model)
    own = model.distribute_strategy
    if isinstance(strategy, tf.distribute.Strategy):
        if strategy is not own:
            raise ValueError("`strategy`: the model was built under another strategy; build and compile it under "
                             "`strategy.scope()` (or pass a build function).")
        return own, model
    if strategy is None or strategy == "auto":
        return own, model
    if strategy not in ("one_device", "mirrored", "multi_worker", "tpu"):
        make_strategy(strategy)  # not a name: raises the ValueError naming `strategy`
    if strategy_name(own) != strategy:
        raise ValueError(f"`strategy` is {strategy!r} but the model was built under {strategy_name(own)!r}; build "
                         f"and compile it under `make_strategy({strategy!r}).scope()` or pass a build function.")
    return own, model


def _check_compiled(model):
    if not getattr(model, "compiled", False) or model.optimizer is None:
        raise ValueError("`model` must be compiled with an optimizer and a loss (under the strategy's scope) "
                         "before training.")


def check_callbacks(callbacks):
    """``callbacks`` as a list of Keras callbacks (``None``: none); one callback not in a list, or anything that is
    no callback, is a ``ValueError`` naming ``callbacks``."""
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)) or not all(isinstance(cb, keras.callbacks.Callback)
                                                            for cb in callbacks):
        raise ValueError(f"`callbacks` must be a list of keras.callbacks.Callback, got {callbacks!r}.")
    return list(callbacks)


def fit(model, data, epochs=1, strategy="auto", callbacks=None, validation_data=None, checkpoint_dir=None,
        save_freq="epoch", steps_per_epoch=None, validation_steps=None, initial_epoch=0, verbose="auto"):
    """Train ``model`` on ``data`` for ``epochs`` epochs under ``strategy``; returns ``(model, history)``.

    ``model``: a compiled model built under the strategy, or a function that builds and compiles one (see the
    module docstring). ``data``: a ``tf.data.Dataset`` of global batches, or (multi-worker loop only, and the way
    to resume exactly with a shuffled order) a function ``epoch -> Dataset``. ``strategy``: a name for
    ``training.distributed.make_strategy`` or a strategy. ``validation_data``: a dataset of global batches,
    evaluated after every epoch (``val_`` logs). ``checkpoint_dir``: back up and restore the training state there
    (``save_freq``: ``"epoch"`` or a number of batches). ``steps_per_epoch``: needed when the dataset's length is
    unknown or infinite; each epoch continues where the previous one stopped, as in ``model.fit``. ``verbose``: 0
    silent, 1 progress bar, 2 one line per epoch (``"auto"``: 1).
    """
    epochs = check_positive_int("epochs", epochs)
    if isinstance(initial_epoch, bool) or not isinstance(initial_epoch, int) or not 0 <= initial_epoch < epochs:
        raise ValueError(f"`initial_epoch` must be an integer in [0, epochs), got {initial_epoch!r}.")
    if save_freq != "epoch":
        save_freq = check_positive_int("save_freq", save_freq)
    if steps_per_epoch is not None:
        steps_per_epoch = check_positive_int("steps_per_epoch", steps_per_epoch)
    if validation_steps is not None:
        validation_steps = check_positive_int("validation_steps", validation_steps)
    if verbose != "auto" and (isinstance(verbose, bool) or verbose not in (0, 1, 2)):
        raise ValueError(f"`verbose` must be 0, 1, 2 or 'auto', got {verbose!r}.")
    callbacks = check_callbacks(callbacks)
    if checkpoint_dir is not None:
        checkpoint_dir = check_output_path("checkpoint_dir", checkpoint_dir, directory=True)
    if keras.backend.backend() != "tensorflow":
        history = keras_backend_fit(model, data, epochs, strategy, callbacks, validation_data,
                                    checkpoint_dir, save_freq, steps_per_epoch, validation_steps, initial_epoch,
                                    verbose)
        return model, history
    if not (isinstance(data, tf.data.Dataset) or callable(data)):
        raise ValueError(f"`data` must be a tf.data.Dataset of (x, y) batches or a function epoch -> Dataset, got "
                         f"{type(data).__name__}.")
    for name, dataset in (("data", data), ("validation_data", validation_data)):
        if isinstance(dataset, tf.data.Dataset) and not (isinstance(dataset.element_spec, tuple)
                                                         and len(dataset.element_spec) in (2, 3)):
            raise ValueError(f"`{name}` must yield (x, y) or (x, y, sample_weight) batches, got elements "
                             f"{dataset.element_spec}.")
    strategy, model = resolve_model(model, strategy)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        if validation_data is not None and not isinstance(validation_data, tf.data.Dataset):
            raise ValueError("`validation_data` must be a tf.data.Dataset of global batches under the multi-worker "
                             f"loop, got {type(validation_data).__name__}.")
        history = distributed_fit(model, strategy, data, epochs, callbacks, validation_data, checkpoint_dir,
                                  save_freq, steps_per_epoch, validation_steps, initial_epoch, verbose)
        return model, history
    if not isinstance(data, tf.data.Dataset):
        raise ValueError("`data` as a function of the epoch is supported by the multi-worker loop only; under "
                         f"{type(strategy).__name__} pass a tf.data.Dataset.")
    check_replica_batches(strategy, data, validation_data, validation_steps)
    # A tf.data.Dataset is batched and shuffled by its own pipeline (Keras warns that it ignores shuffle=True).
    history = _model_fit(model, data, epochs, callbacks, validation_data, checkpoint_dir, save_freq,
                         steps_per_epoch, validation_steps, initial_epoch, verbose, shuffle=False)
    return model, history


def _model_fit(model, data, epochs, callbacks, validation_data, checkpoint_dir, save_freq, steps_per_epoch,
               validation_steps, initial_epoch, verbose, shuffle):
    """``model.fit`` with a plain ``BackupAndRestore`` in ``callbacks`` (or ``checkpoint_dir``) made atomic."""
    plain = [cb for cb in callbacks if type(cb) is keras.callbacks.BackupAndRestore]
    if plain:
        callbacks, checkpoint_dir, save_freq = _split_backup_callbacks(callbacks, checkpoint_dir, save_freq,
                                                                       only_plain=True)
    if checkpoint_dir is not None:
        delete = all(cb.delete_checkpoint for cb in plain)
        callbacks.append(AtomicBackupAndRestore(checkpoint_dir, save_freq=save_freq, delete_checkpoint=delete,
                                                callbacks=callbacks))
    return model.fit(data, epochs=epochs, callbacks=callbacks, validation_data=validation_data,
                     steps_per_epoch=steps_per_epoch, validation_steps=validation_steps, initial_epoch=initial_epoch,
                     verbose=verbose, shuffle=shuffle)


def keras_backend_fit(model, data, epochs, strategy, callbacks, validation_data, checkpoint_dir, save_freq,
                      steps_per_epoch, validation_steps, initial_epoch, verbose):
    """:func:`fit` on Keras' JAX and PyTorch backends: ``model.fit`` on ``data`` (a ``keras.utils.PyDataset`` such
    as ``training.data.arrays.ArrayBatches``, a ``tf.data.Dataset`` where TensorFlow is installed, or any input
    ``model.fit`` reads), with a ``BackupAndRestore`` (or ``checkpoint_dir``) made atomic as on TensorFlow.
    Seeded batches that draw each epoch from ``(seed, epoch)`` (``ArrayBatches``, ``ClassBalancedBatches``: an
    ``epoch_callback``) are told ``fit``'s epoch at every epoch start and are not reshuffled by Keras, so a run
    resumed from its backup trains on the batches an uninterrupted run would.
    ``strategy``: ``"auto"`` or ``"one_device"`` (the device layout was chosen when the model was built; see
    ``training.distributed.keras_distribution``); a ``tf.distribute`` strategy's name raises ``ValueError``."""
    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a compiled keras.Model on the {keras.backend.backend()} backend (build "
                         f"functions serve tf.distribute strategies), got {model!r}.")
    _check_compiled(model)
    if strategy is not None and strategy != "auto":
        keras_distribution(strategy)  # a tf.distribute name: the ValueError naming `strategy`
    _check_batches_split(data, validation_data, steps_per_epoch, validation_steps, epochs - initial_epoch)
    seeded = hasattr(data, "epoch_callback")
    if seeded:
        callbacks = [data.epoch_callback()] + callbacks
    return _model_fit(model, data, epochs, callbacks, validation_data, checkpoint_dir, save_freq, steps_per_epoch,
                      validation_steps, initial_epoch, verbose, shuffle=not seeded)


def _check_batches_split(data, validation_data, steps_per_epoch=None, validation_steps=None, epochs=1):
    """Under ``keras.distribution.DataParallel`` (``--strategy auto`` on JAX with several devices) every batch is
    split evenly over the devices; JAX refuses a batch that does not split, deep inside ``fit`` (for a last, smaller
    validation batch: after the first epoch's training). Checked before training, an ``UnevenSplitError`` naming
    the data: batches that know their sizes (``batch_sizes()``: ``ArrayBatches``, ``ClassBalancedBatches``), and
    ``tf.data`` datasets (:func:`_batch_sizes`: a static batch size at once, else one pass over the batches ``fit``
    will read; ``steps_per_epoch`` / ``validation_steps``: the first ``epochs`` times as many, as ``fit`` keeps one
    iterator across epochs). Not checked: an endless dataset of unknown batch size without its steps, and any other
    input (NumPy arrays, a plain ``PyDataset``). On one device nothing is read."""
    devices = batch_devices(keras.distribution.distribution()) if keras.backend.backend() == "jax" else 1
    if devices < 2:
        return
    for name, batches, steps in (("data", data, steps_per_epoch), ("validation_data", validation_data,
                                                                     validation_steps)):
        hint = ""
        if _is_dataset(batches):
            sizes = _batch_sizes(batches, None if steps is None else steps * epochs, devices)
            largest = sizes.uneven if sizes is not None else 0
            hint = " (or batch with drop_remainder=True)"
        else:
            largest = max((size for size in getattr(batches, "batch_sizes", set)() if size % devices), default=0)
        if largest:
            raise UnevenSplitError(
                f"`{name}`: a batch of {largest} examples does not split over the {devices} devices that "
                "keras.distribution.DataParallel shares every batch among (strategy 'auto' on JAX): take a batch "
                f"size (otzoo train --batch-size), and a data size for the last batch, that is a multiple of "
                f"{devices}{hint}, or strategy 'one_device'.")


def _is_dataset(data):
    """Whether ``data`` is a ``tf.data.Dataset``, without importing TensorFlow where it is not installed (no
    dataset exists there)."""
    return not isinstance(tf, AbsentModule) and isinstance(data, tf.data.Dataset)


BatchSizes = collections.namedtuple("BatchSizes", "smallest largest examples uneven")


def _batch_sizes(dataset, steps=None, divisor=1):
    """:class:`BatchSizes` ``(smallest, largest, examples, uneven)`` of the batches of ``dataset`` (of its first
    ``steps`` when given; ``examples`` ``None`` when not counted; ``uneven`` the largest batch size that is no
    multiple of ``divisor``, 0 when none), or ``None`` when it cannot be told without reading an endless dataset.
    A static batch dimension (``drop_remainder=True``) answers at once; else one pass reads the batches' sizes
    (the data only, not the model: less than one epoch's evaluation, or the ``steps`` batches). That pass is an
    iteration of the dataset: a ``shuffle(reshuffle_each_iteration=True)`` or a ``rerandomize_each_iteration`` draw
    in it moves on by one, so training's first epoch sees the order and draws an unchecked run's second would."""
    spec = tf.nest.flatten(dataset.element_spec)[0]
    if spec.shape.rank is None or spec.shape.rank == 0:
        return None
    if spec.shape[0] is not None:
        size = int(spec.shape[0])
        return BatchSizes(size, size, None, size if size % divisor else 0)
    if steps is not None:
        dataset = dataset.take(steps)
    elif int(dataset.cardinality()) < 0:
        return None
    divisor = tf.constant(divisor, tf.int64)
    sizes = dataset.map(lambda *element: tf.shape(tf.nest.flatten(element)[0], out_type=tf.int64)[0])
    smallest, largest, examples, uneven = sizes.reduce(
        (tf.constant(tf.int64.max), tf.constant(0, tf.int64), tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
        lambda state, size: (tf.minimum(state[0], size), tf.maximum(state[1], size), state[2] + size,
                             tf.where(size % divisor != 0, tf.maximum(state[3], size), state[3])))
    if int(examples) == 0:
        return None  # no batch: an empty dataset is refused elsewhere
    return BatchSizes(int(smallest), int(largest), int(examples), int(uneven))


def check_replica_batches(strategy, data, validation_data=None, validation_steps=None):
    """Under a strategy of several replicas, every batch of ``data`` and ``validation_data`` (``tf.data`` datasets
    of global batches; a function of the epoch is not checked) must hold at least one example per replica:
    else :class:`EmptyReplicaError` naming the data, before training. A last, smaller batch of ``drop_remainder=False``
    is the usual culprit; an endless dataset of unknown batch size is not checked."""
    replicas = strategy.num_replicas_in_sync
    if replicas < 2:
        return
    for name, dataset, steps in (("data", data, None), ("validation_data", validation_data, validation_steps)):
        sizes = _batch_sizes(dataset, steps) if isinstance(dataset, tf.data.Dataset) else None
        if sizes is None or sizes.smallest >= replicas:
            continue
        smallest, largest, examples, _ = sizes
        option = " (otzoo train --batch-size)" if name == "data" else ""
        if smallest == largest:
            found, fix = f"batches of {smallest} example(s)", f"a batch size of at least {replicas}{option}"
        else:
            found = f"{examples} examples in batches of {largest} include a batch of {smallest}"
            size = f"a batch size{option}" if name == "data" else "a data size or batch size"
            fix = f"{size} that leaves a last batch of 0 or at least {replicas} examples, or drop_remainder=True"
        raise EmptyReplicaError(
            f"`{name}`: {found}, fewer than the {replicas} replicas of strategy {strategy_name(strategy)}, so a "
            f"replica would get an empty batch (TensorFlow's CPU convolution fails on one): take {fix}, or "
            "strategy 'one_device'.")


# --- the multi-worker loop ---------------------------------------------------------------------------------------

def _epoch_dataset(data, epoch):
    dataset = data(epoch) if not isinstance(data, tf.data.Dataset) else data
    if not isinstance(dataset, tf.data.Dataset):
        raise ValueError(f"`data`: the function returned {type(dataset).__name__} for epoch {epoch}, not a "
                         "tf.data.Dataset.")
    return dataset


def _data_position(epoch, step, steps, cardinality):
    """The batches of the current pass over a dataset that an uninterrupted run, started at epoch 0 with a fresh
    iterator, has read after ``step`` batches of ``epoch`` (model.fit's order: an epoch of ``steps`` batches
    continues where the previous one stopped and ends early when the dataset of ``cardinality`` batches is
    exhausted; the next epoch starts the dataset again). Used for checkpoints that saved no position."""
    if cardinality < 0:
        return epoch * steps + step
    epochs_per_pass = -(-cardinality // steps)
    return (epoch % epochs_per_pass) * steps + step


def _steps(dataset, steps, name):
    cardinality = int(dataset.cardinality())
    if steps is not None:
        if cardinality >= 0 and steps > cardinality:  # the loop would run out of data in the middle of an epoch
            raise ValueError(f"`{name}` ({steps}) is more than the {cardinality} batch(es) the dataset holds; repeat "
                             "the dataset or give fewer steps.")
        return steps
    if cardinality < 0:
        raise ValueError(f"`{name}` is needed: the dataset's length is unknown or infinite.")
    if cardinality == 0:
        what = "validation_data" if name == "validation_steps" else "data"
        raise ValueError(f"`{what}` is empty: the dataset holds no batch.")
    return cardinality


def _split_backup_callbacks(callbacks, checkpoint_dir, save_freq, only_plain=False):
    """Take the ``keras.callbacks.BackupAndRestore`` instances (``only_plain``: not its subclasses, such as
    ``AtomicBackupAndRestore``) out of ``callbacks``; their directory and ``save_freq`` become the checkpoint's."""
    kept = []
    for callback in callbacks:
        take = type(callback) is keras.callbacks.BackupAndRestore if only_plain else \
            isinstance(callback, keras.callbacks.BackupAndRestore)
        if take:
            if checkpoint_dir is not None and checkpoint_dir != callback.backup_dir:
                raise ValueError("`checkpoint_dir` and a BackupAndRestore callback name different directories.")
            checkpoint_dir, save_freq = callback.backup_dir, callback.save_freq
            continue
        kept.append(callback)
    return kept, checkpoint_dir, save_freq


def distributed_fit(model, strategy, data, epochs, callbacks=(), validation_data=None, checkpoint_dir=None,
                    save_freq="epoch", steps_per_epoch=None, validation_steps=None, initial_epoch=0,
                    verbose="auto"):
    """The loop :func:`fit` runs under ``MultiWorkerMirroredStrategy`` (any strategy works); returns the
    ``History``. Arguments as :func:`fit`, already validated; ``model`` was built under ``strategy``.

    Every worker runs this with the same arguments, in lockstep: each step and each read of the logs is a
    collective operation across all of them.
    """
    callbacks, checkpoint_dir, save_freq = _split_backup_callbacks(list(callbacks), checkpoint_dir, save_freq)
    chief = is_chief()
    if not chief:
        callbacks = [cb for cb in callbacks if not isinstance(cb, CHIEF_ONLY_CALLBACKS)]
    verbose = 1 if verbose == "auto" else int(verbose)
    first = _epoch_dataset(data, initial_epoch)
    steps = _steps(first, steps_per_epoch, "steps_per_epoch")
    validation_count = None if validation_data is None else _steps(validation_data, validation_steps,
                                                                   "validation_steps")  # before any epoch trains
    check_replica_batches(strategy, first, validation_data, validation_count)
    with strategy.scope():
        model._symbolic_build(data_batch=next(iter(first)))  # noqa: SLF001 - what model.fit does: create the
        # optimizer's and the metrics' variables now, under the scope, not while a step is traced
    callback_list = keras.callbacks.CallbackList(callbacks, add_history=True,
                                                 add_progbar=bool(verbose) and chief, verbose=verbose,
                                                 epochs=epochs, steps=steps, model=model)
    checkpoint = TrainingCheckpoint(checkpoint_dir, model, callbacks) if checkpoint_dir is not None else None
    start_epoch, start_step, position = initial_epoch, 0, 0
    if checkpoint is not None:
        restored_epoch, restored_step = checkpoint.restore()
        if (restored_epoch, restored_step) != (0, 0):
            start_epoch, start_step = restored_epoch, restored_step
            position = checkpoint.position
    # A Dataset is read as model.fit reads it: one iterator across epochs, started again once the dataset is
    # exhausted (with ``steps_per_epoch`` an epoch continues where the previous one stopped). ``position``: the
    # batches read from the current pass. Data given as a function of the epoch is a new dataset every epoch.
    per_epoch = not isinstance(data, tf.data.Dataset)
    # cardinality < 0: infinite, or unknown until the dataset runs out (the number of batches read then)
    cardinality = tf.data.INFINITE_CARDINALITY if per_epoch else int(first.cardinality())
    if per_epoch or position is None:  # position None: a checkpoint of an earlier otzoo, which saved none
        # Of a dataset of unknown length, only the epoch's own batches are known to exist (the earlier otzoo read
        # each epoch from the start): a guess past the end would be taken for the length when the data ran out.
        unknown = cardinality == tf.data.UNKNOWN_CARDINALITY
        position = start_step if per_epoch or unknown else _data_position(start_epoch, start_step, steps,
                                                                           cardinality)
    iterator = None
    ran_out = False

    # After ``strategy.run`` the function is in cross-replica context, where reading the metrics' (sync-on-read)
    # variables sums them over every replica of every worker: the logs are the global ones, on every worker.
    @tf.function
    def train_steps(iterator):
        strategy.run(model.train_step, args=(next(iterator),))
        return model.get_metrics_result()

    # For a dataset of unknown length: a step on a batch only if there is one (every worker agrees). A step on
    # an exhausted iterator (next() raising OutOfRangeError) can have counted an empty batch in the metrics and the
    # optimizer's iterations before raising, depending on the order its operations ran in.
    @tf.function
    def train_steps_if_any(iterator):
        batch = iterator.get_next_as_optional()
        found = batch.has_value()
        if found:
            strategy.run(model.train_step, args=(batch.get_value(),))
        return found, model.get_metrics_result()

    @tf.function
    def test_steps(iterator):
        strategy.run(model.test_step, args=(next(iterator),))
        return model.get_metrics_result()

    @tf.function
    def metrics_result():
        return model.get_metrics_result()

    def python_logs(logs):
        return {key: float(value) for key, value in logs.items()}

    def batches(dataset, skip):
        return iter(strategy.experimental_distribute_dataset(dataset.skip(skip) if skip else dataset))

    model.stop_training = False
    model.train_function = train_steps  # TensorBoard & co. look for it
    callback_list.on_train_begin()
    model.train_function = train_steps  # again: a callback may have made Keras' own (CCP, installing its penalty)
    if checkpoint is not None:
        checkpoint.restore_callback_state()
    epoch_logs = {}
    save_every = None if save_freq == "epoch" else int(save_freq)
    for epoch in range(start_epoch, epochs):
        skip = start_step if epoch == start_epoch else 0
        # Resumed mid-epoch: the metrics hold the totals of the epoch's first `skip` batches (restored with them).
        resumed_metrics = bool(skip) and checkpoint.restored_metrics
        if not resumed_metrics:
            model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        if per_epoch:
            iterator, position = batches(_epoch_dataset(data, epoch) if epoch != initial_epoch else first, skip), skip
        logs = python_logs(metrics_result()) if resumed_metrics else {}
        for step in range(skip, steps):
            if 0 <= cardinality <= position:  # the dataset is exhausted: model.fit ends the epoch here
                ran_out = True
                break
            if iterator is None:
                iterator = batches(data, position)
            callback_list.on_train_batch_begin(step)
            if cardinality != tf.data.UNKNOWN_CARDINALITY:
                results = train_steps(iterator)
            else:
                found, results = train_steps_if_any(iterator)
                if not bool(found):
                    if position == 0:
                        raise ValueError("`data` is empty: the dataset holds no batch.")
                    # The dataset of unknown length ran out: its length is known now. Start the next pass here
                    # when no batch of this epoch has run yet, else end the epoch (model.fit ends it too).
                    cardinality, iterator, position = position, None, 0
                    if step > 0:
                        ran_out = True
                        break
                    iterator = batches(data, 0)
                    results = train_steps(iterator)
            position += 1
            logs = python_logs(results)
            callback_list.on_train_batch_end(step, logs)
            if checkpoint is not None and save_every and (step + 1) % save_every == 0 and step + 1 < steps:
                checkpoint.save(epoch, step + 1, position)
            if model.stop_training:
                break
        if 0 <= cardinality <= position:  # start the next pass with the next epoch
            iterator, position = None, 0
        epoch_logs = dict(logs)
        if validation_data is not None:
            model.reset_metrics()
            val_iterator = iter(strategy.experimental_distribute_dataset(validation_data))
            for _ in range(validation_count):
                val_logs = test_steps(val_iterator)
            epoch_logs.update({f"val_{key}": value for key, value in python_logs(val_logs).items()})
        callback_list.on_epoch_end(epoch, epoch_logs)
        if checkpoint is not None:
            checkpoint.save(epoch + 1, 0, position)
        if model.stop_training:
            break
    if ran_out:
        warnings.warn(f"`data` ran out before some epoch's {steps} steps; that epoch ended early and the next one "
                      "read the dataset from its start again (as model.fit does). Give `steps_per_epoch` dividing "
                      "the dataset's length, or repeat the dataset.", stacklevel=2)
    if isinstance(model.optimizer, keras.optimizers.Optimizer):
        model.optimizer.finalize_variable_values(model.trainable_weights)
    callback_list.on_train_end(logs=epoch_logs)
    if checkpoint is not None:
        checkpoint.delete()
    return model.history


def describe_batches(strategy, global_batch):
    """A one-line statement of the batch sizes under ``strategy`` (for logs and ``otzoo train``): the global batch,
    the replicas, the batch per replica and per worker."""
    global_batch = check_positive_int("global_batch", global_batch)
    replicas = strategy.num_replicas_in_sync
    if global_batch % replicas:
        raise ValueError(f"`global_batch` ({global_batch}) must be divisible by the {replicas} replicas.")
    workers = 1
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        spec = strategy.cluster_resolver.cluster_spec().as_dict()
        workers = max(1, sum(len(tasks) for tasks in spec.values()))
    return (f"global batch {global_batch} = {replicas} replica(s) x {global_batch // replicas} "
            f"({workers} worker(s) x {global_batch // workers} per worker), strategy {strategy_name(strategy)}")

