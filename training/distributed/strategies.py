"""``tf.distribute`` strategies by name: ``auto``, ``one_device``, ``mirrored``, ``multi_worker``, ``tpu``.

:func:`make_strategy` is the one place the package turns a name (the ``--strategy`` option of ``otzoo train``) into a
strategy. Models must be built and compiled under ``strategy.scope()``: the variables are placed (mirrored across
the replicas) when they are created, so a model built outside the scope cannot be trained by the strategy.

``multi_worker`` reads the cluster from the ``TF_CONFIG`` environment variable (see :func:`tf_config` and
``docs/distributed.md``). TensorFlow requires ``MultiWorkerMirroredStrategy`` to be created at the start of the
program, before any other TensorFlow operation runs, in every worker process; create it first, then build the model.
A process holds at most one: later calls return the same object (a second one would fail).
"""
import json
import os

from ot_layers.optional import tensorflow_if_installed

tf = tensorflow_if_installed("tf.distribute strategies")

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")

_MULTI_WORKER = []  # the process's MultiWorkerMirroredStrategy, once created


def tf_config():
    """The parsed ``TF_CONFIG`` (``{"cluster": {"worker": [...]}, "task": {"type": ..., "index": ...}}``) or
    ``None`` when it is unset or empty. Malformed JSON, a config that is not that shape (``cluster`` a non-empty dict
    of lists of ``"host:port"`` strings, ``task`` a dict with a string ``type`` and an integer ``index``), or a task
    that is not in the cluster raises ``ValueError`` naming ``TF_CONFIG`` and what is wrong."""
    text = os.environ.get("TF_CONFIG", "").strip()
    if not text:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"`TF_CONFIG` is not valid JSON ({error}).") from None
    if not isinstance(config, dict):
        raise ValueError("`TF_CONFIG` must be a JSON object {\"cluster\": {...}, \"task\": {...}}, got "
                         f"{text!r}.")
    cluster, task = config.get("cluster"), config.get("task", {})
    if not isinstance(cluster, dict) or not cluster:
        raise ValueError(f"`TF_CONFIG` must hold a non-empty 'cluster' dict, got {text!r}.")
    for kind, addresses in cluster.items():
        if not isinstance(addresses, list) or not all(_is_address(address) for address in addresses):
            raise ValueError(f"`TF_CONFIG`: cluster entry {kind!r} must be a list of 'host:port' strings, got "
                             f"{addresses!r}.")
    if "task" not in config:
        raise ValueError("`TF_CONFIG` has no 'task' {\"type\": ..., \"index\": ...}: which task of the cluster this "
                         "process is.")
    if not isinstance(task, dict):
        raise ValueError(f"`TF_CONFIG`: 'task' must be a dict {{\"type\": ..., \"index\": ...}}, got {task!r}.")
    kind, index = task.get("type"), task.get("index", 0)
    if not isinstance(kind, str):
        raise ValueError(f"`TF_CONFIG`: the task's 'type' must be a string naming an entry of the cluster "
                         f"({', '.join(map(repr, cluster))}), got {kind!r}.")
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(f"`TF_CONFIG`: the task's 'index' must be an integer, got {index!r}.")
    if kind not in cluster or not 0 <= index < len(cluster[kind]):
        raise ValueError(f"`TF_CONFIG`: task {task!r} is not in the cluster {cluster!r}.")
    return config


def _is_address(address):
    """Whether ``address`` is a ``"host:port"`` string (the port a number)."""
    if not isinstance(address, str):
        return False
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit()


def task_address(config):
    """The ``"host:port"`` of the task ``config`` (a :func:`tf_config` result) describes: where it listens."""
    task = config["task"]
    return config["cluster"][task["type"]][task.get("index", 0)]


def cluster_size():
    """The number of worker processes ``TF_CONFIG`` names (chief and workers), 1 without ``TF_CONFIG``."""
    config = tf_config()
    if config is None:
        return 1
    return sum(len(config["cluster"].get(kind, [])) for kind in ("chief", "worker"))


def uses_multi_worker(name="auto", workers=1):
    """Whether a run under strategy ``name`` (one of :data:`STRATEGIES`) trains under ``MultiWorkerMirroredStrategy``
    (by ``training.distributed.fit``'s own loop): ``"multi_worker"``; ``"auto"`` when ``TF_CONFIG`` names more than
    one worker; any name with ``workers`` > 1 (``otzoo train --workers N``, whose workers run ``multi_worker``).
    The one statement of the rule, for :func:`make_strategy` and for ``otzoo train``, which must know the trainer
    before any strategy is made (a worker's ``MultiWorkerMirroredStrategy`` must come before any other TensorFlow
    operation): it reads ``TF_CONFIG`` only."""
    return workers > 1 or name == "multi_worker" or (name == "auto" and cluster_size() > 1)


def is_chief():
    """Whether this process is the cluster's chief: the ``chief`` task, or worker 0 when there is no chief (and
    always without ``TF_CONFIG``). Only the chief's checkpoints and logs are kept."""
    config = tf_config()
    if config is None:
        return True
    kind, index = config["task"]["type"], config["task"].get("index", 0)
    if "chief" in config["cluster"]:
        return kind == "chief"
    return kind == "worker" and index == 0


def _local_devices():
    """All local GPUs, else all logical CPU devices (one unless the program split the CPU on purpose)."""
    gpus = tf.config.list_logical_devices("GPU")
    return [d.name for d in gpus] if gpus else [d.name for d in tf.config.list_logical_devices("CPU")]


class ClusterStartError(RuntimeError):
    """This process could not start its server of the ``TF_CONFIG`` cluster: its task's address could not be
    listened on (the port in use by another process, or the host not one of this machine's addresses)."""


def multi_worker_strategy():
    """The process's ``MultiWorkerMirroredStrategy`` over the ``TF_CONFIG`` cluster (created on the first call;
    collectives by ring all-reduce on CPUs, NCCL on GPUs when TensorFlow picks it). A task whose address cannot be
    listened on raises :class:`ClusterStartError` naming ``TF_CONFIG`` and the address (TensorFlow's error, "Could
    not start gRPC server", chained)."""
    if not _MULTI_WORKER:
        config = tf_config()
        if config is None:
            raise ValueError("`strategy`: 'multi_worker' needs the TF_CONFIG environment variable describing the "
                             "cluster (see docs/distributed.md), or use `otzoo train --workers N` to launch local "
                             "workers.")
        try:
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
        except tf.errors.OpError as error:
            if "could not start grpc server" not in str(error).lower():
                raise
            task = config["task"]
            raise ClusterStartError(
                f"`TF_CONFIG`: could not listen on {task_address(config)} (this task's address, {task['type']} "
                f"{task.get('index', 0)}): in use? Another process may hold the port, or the host is not this "
                "machine's; free it or give the task another address.") from error
        _MULTI_WORKER.append(strategy)
    return _MULTI_WORKER[0]


def multi_worker_started():
    """Whether this process has made its ``MultiWorkerMirroredStrategy`` (:func:`multi_worker_strategy`): models
    built under it are trained by ``training.distributed.fit``'s own loop."""
    return bool(_MULTI_WORKER)


def _check_devices(devices, name):
    """``devices`` as a list of this process's logical device names, or ``None``; a device that does not exist
    here (TensorFlow would place the variables on the CPU without a word), a name that is not one, or ``devices``
    with a strategy that takes none is a ``ValueError`` naming ``devices``."""
    if devices is None:
        return None
    if isinstance(devices, str) or not isinstance(devices, (list, tuple)) or not devices \
            or not all(isinstance(device, str) for device in devices):
        raise ValueError(f"`devices` must be a non-empty list of device names, got {devices!r}.")
    if name not in ("one_device", "mirrored"):
        raise ValueError(f"`devices` applies to 'one_device' and 'mirrored', not {name!r}.")
    local = {(d.device_type, int(d.name.rsplit(":", 1)[1])) for d in tf.config.list_logical_devices()}
    for device in devices:
        try:
            spec = tf.DeviceSpec.from_string(device)
        except ValueError:
            spec = None
        if spec is None or spec.device_type is None or (spec.device_type.upper(), spec.device_index or 0) not in local:
            names = ", ".join(sorted(f"/{kind.lower()}:{index}" for kind, index in local))
            raise ValueError(f"`devices`: {device!r} is no device of this process (it has {names}).")
    return list(devices)


def make_strategy(name="auto", devices=None):
    """A ``tf.distribute.Strategy`` by ``name`` (a strategy object is returned as is).

    - ``"auto"``: ``multi_worker`` when ``TF_CONFIG`` names more than one worker; else ``MirroredStrategy`` over
      all local GPUs when there are two or more; else the default strategy (one device, no replication).
    - ``"one_device"``: ``OneDeviceStrategy`` on the first GPU, else the CPU (``devices``: one device name).
    - ``"mirrored"``: ``MirroredStrategy`` over ``devices`` (default: all local GPUs, else all logical CPU devices;
      on CPUs the gradients are reduced through one device instead of collective ops).
    - ``"multi_worker"``: ``MultiWorkerMirroredStrategy`` from ``TF_CONFIG`` (:func:`multi_worker_strategy`).
    - ``"tpu"``: ``TPUStrategy`` on the TPU the cluster resolver finds (``TPU_NAME`` or a local TPU VM).

    ``devices`` must be devices of this process (``tf.config.list_logical_devices``); another name raises
    ``ValueError`` (TensorFlow would otherwise place everything on the CPU without a word).
    """
    if isinstance(name, tf.distribute.Strategy):
        if devices is not None:
            raise ValueError("`devices` applies to a strategy made by name; the strategy given has its own.")
        return name
    if name not in STRATEGIES:
        raise ValueError(f"`strategy` must be one of {list(STRATEGIES)} or a tf.distribute.Strategy, got {name!r}.")
    devices = _check_devices(devices, name)
    if uses_multi_worker(name):  # "multi_worker", or "auto" with a TF_CONFIG of several workers
        return multi_worker_strategy()
    if name == "auto":
        gpus = tf.config.list_logical_devices("GPU")
        if len(gpus) > 1:
            return tf.distribute.MirroredStrategy([d.name for d in gpus])
        return tf.distribute.get_strategy()
    if name == "one_device":
        if devices is not None and len(devices) != 1:
            raise ValueError(f"`devices` must name one device for 'one_device', got {devices!r}.")
        gpus = tf.config.list_logical_devices("GPU")
        device = devices[0] if devices is not None else (gpus[0].name if gpus else "/cpu:0")
        return tf.distribute.OneDeviceStrategy(device)
    if name == "mirrored":
        devices = devices if devices is not None else _local_devices()
        if all("CPU" in device.upper() for device in devices):
            # On logical CPU devices the collective all-reduce of a second model's training function reuses the
            # instance keys of an earlier model's in the same process ("Shape mismatch in the collective instance
            # 100"); reducing through one device avoids collectives (and costs nothing on one host's memory).
            return tf.distribute.MirroredStrategy(devices, cross_device_ops=tf.distribute.ReductionToOneDevice())
        return tf.distribute.MirroredStrategy(devices)
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", "local"))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as error:
        raise ValueError(f"`strategy`: 'tpu' found no TPU ({type(error).__name__}: {error}).") from None
    return tf.distribute.TPUStrategy(resolver)


def strategy_name(strategy):
    """The short name of a strategy object (the inverse of :func:`make_strategy`, ``"default"`` for none)."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return "one_device"
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "tpu"
    return "default"
