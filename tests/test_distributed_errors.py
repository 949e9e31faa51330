"""What the distributed machinery says when its input or its environment is wrong: a malformed ``TF_CONFIG``, a
``TF_CONFIG`` address already in use, a backup written by the other trainer; and a launcher stopped by a signal
takes its workers with it."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import keras
import pytest

import distributed_models as dm
from training.distributed import strategies
from training.distributed.checkpoints import AtomicBackupAndRestore, OtherTrainerError, TrainingCheckpoint
from training.distributed.fit import fit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("config, message", [
    ("[1]", r"^`TF_CONFIG` must be a JSON object \{\"cluster\": \{...\}, \"task\": \{...\}\}, got '\[1\]'"),
    ('"worker"', "^`TF_CONFIG` must be a JSON object"),
    ({"cluster": {"worker": ["a:1"]}, "task": "worker"}, "^`TF_CONFIG`: 'task' must be a dict .*, got 'worker'"),
    ({"cluster": {"worker": ["a:1"]}, "task": None}, "^`TF_CONFIG`: 'task' must be a dict .*, got None"),
    ({"cluster": {"worker": ["a:1"]}}, "^`TF_CONFIG` has no 'task'"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": ["worker"], "index": 0}},
     r"^`TF_CONFIG`: the task's 'type' must be a string naming an entry of the cluster \('worker'\), got \['worker'\]"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}, "^`TF_CONFIG`: the task's 'type' must be a string"),
    ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": True}},
     "^`TF_CONFIG`: the task's 'index' must be an integer, got True"),
    ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": "1"}},
     "^`TF_CONFIG`: the task's 'index' must be an integer, got '1'"),
    ({"cluster": {"worker": "localhost:1234"}, "task": {"type": "worker", "index": 3}},
     "^`TF_CONFIG`: cluster entry 'worker' must be a list of 'host:port' strings, got 'localhost:1234'"),
    ({"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", "index": 0}},
     r"^`TF_CONFIG`: cluster entry 'worker' must be a list of 'host:port' strings, got \['localhost'\]"),
    ({"cluster": {"worker": [1234]}, "task": {"type": "worker", "index": 0}}, "^`TF_CONFIG`: cluster entry 'worker'"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}, "^`TF_CONFIG`: task .* is not in"),
])
def test_a_malformed_tf_config_is_a_value_error_naming_it(config, message, monkeypatch):
    """Tracebacks before (AttributeError for a list or a task that is no dict, TypeError for a list as the type),
    or wrongly taken: a cluster entry given as one string counted its characters as workers (14), an index of
    ``true`` was task 1."""
    monkeypatch.setenv("TF_CONFIG", config if isinstance(config, str) else json.dumps(config))
    for read in (strategies.tf_config, strategies.cluster_size, strategies.is_chief):
        with pytest.raises(ValueError, match=message):
            read()


def test_a_well_formed_tf_config_is_read(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["h0:1"], "worker": ["h1:2", "[::1]:3"]},
                                                "task": {"type": "worker", "index": 1}}))
    assert strategies.cluster_size() == 3 and not strategies.is_chief()
    assert strategies.task_address(strategies.tf_config()) == "[::1]:3"


def _held_port():
    """A socket listening on a port of 127.0.0.1 (another process's server, for what TensorFlow sees)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def _cluster_env(port):
    config = {"cluster": {"worker": [f"127.0.0.1:{port}", "127.0.0.1:1"]}, "task": {"type": "worker", "index": 0}}
    return dict(os.environ, TF_CONFIG=json.dumps(config), CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")


def test_a_tf_config_address_in_use_names_it_in_one_line():
    """``MultiWorkerMirroredStrategy()`` on an address another process listens on raised TensorFlow's
    ``UnknownError`` ("Could not start gRPC server") through 17 frames; ``make_strategy`` names ``TF_CONFIG`` and
    the address (TensorFlow's error chained), and ``otzoo train`` prints that one line (exit status 1: a relaunch on
    other ports can succeed). In subprocesses: a process creates its multi-worker strategy once."""
    with _held_port() as sock:
        port = sock.getsockname()[1]
        code = ("from training.distributed.strategies import ClusterStartError, make_strategy\n"
                "try:\n    make_strategy('multi_worker')\n"
                "except ClusterStartError as error:\n"
                "    print(type(error.__cause__).__name__, '|', error)\n")
        direct = subprocess.run([sys.executable, "-c", code], env=_cluster_env(port), cwd=ROOT, capture_output=True,
                                text=True, timeout=240)
        assert direct.returncode == 0, direct.stderr[-3000:]
        assert direct.stdout.strip() == (f"UnknownError | `TF_CONFIG`: could not listen on 127.0.0.1:{port} (this "
                                         "task's address, worker 0): in use? Another process may hold the port, or "
                                         "the host is not this machine's; free it or give the task another address.")


def test_otzoo_train_on_a_tf_config_address_in_use_is_one_line(tmp_path):
    with _held_port() as sock:
        port = sock.getsockname()[1]
        result = subprocess.run([sys.executable, "-m", "otzoo", "train", "resnet20_gap_fashion_mnist", "--strategy",
                                 "multi_worker", "--limit", "64", "--epochs", "1", "--out", str(tmp_path / "run")],
                                env=_cluster_env(port), cwd=ROOT, capture_output=True, text=True, timeout=240)
    err = [line for line in result.stderr.splitlines() if "otzoo" in line or "Traceback" in line]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert err == [f"otzoo train: error: `TF_CONFIG`: could not listen on 127.0.0.1:{port} (this task's address, "
                   "worker 0): in use? Another process may hold the port, or the host is not this machine's; free it "
                   "or give the task another address."]


def test_otzoo_prints_a_cluster_that_cannot_start_in_one_line(monkeypatch, capsys):
    from otzoo import cli

    def refuse(args):
        raise strategies.ClusterStartError("`TF_CONFIG`: could not listen on 127.0.0.1:5 (this task's address, "
                                           "worker 0): in use?")

    monkeypatch.setattr(cli, "train", refuse)
    assert cli.main(["train", "resnet20_gap_fashion_mnist"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("otzoo train: error: `TF_CONFIG`: could not listen on 127.0.0.1:5 (this task's address, worker 0): "
                   "in use?")


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) is gone for this purpose
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_launcher_stopped_by_a_signal_stops_its_workers(signum, tmp_path):
    """The workers run in sessions of their own: a SIGTERM (a job scheduler's) or SIGHUP (a closed terminal) to the
    launcher killed it and left them running, waiting forever in their next collective."""
    pids = tmp_path / "pids"
    pids.mkdir()
    worker = (f"import os, time; open(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close(); "
              "time.sleep(120)")
    # the default handlers first: a test run under nohup would hand the launcher an ignored SIGHUP, which it keeps
    launcher = ("import signal, sys\nfrom training.distributed.launch import launch_workers\n"
                "signal.signal(signal.SIGHUP, signal.SIG_DFL); signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
                f"launch_workers([sys.executable, '-c', {worker!r}], 2, {str(tmp_path / 'logs')!r}, timeout=150)\n")
    process = subprocess.Popen([sys.executable, "-c", launcher], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    started = []
    try:
        deadline = time.monotonic() + 120
        while len(started) < 2 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
            started = [int(name) for name in os.listdir(pids)]
        assert len(started) == 2, process.communicate(timeout=10)[0] if process.poll() is not None else started
        process.send_signal(signum)
        output = process.communicate(timeout=30)[0]
        deadline = time.monotonic() + 5
        while any(_pid_alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in started if _pid_alive(pid)], "workers left running"
        assert process.returncode == 128 + signum, output[-3000:]  # SystemExit(128 + signal), as a shell reports it
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in started:  # the workers this test started, if the launcher left them behind
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def test_the_launcher_puts_the_signal_handlers_back(tmp_path):
    from training.distributed.launch import launch_workers

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    results = launch_workers([sys.executable, "-c", "print('done')"], 2, str(tmp_path))
    assert [r.returncode for r in results] == [0, 0]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before


def test_an_ignored_signal_stays_ignored_while_the_workers_run(tmp_path):
    """``nohup otzoo train --workers N`` ignores SIGHUP: the terminal's closing must not stop the launcher."""
    code = ("import os, signal, sys\n"
            "from training.distributed.launch import launch_workers\n"
            "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
            "worker = [sys.executable, '-c', 'import os, signal, time; os.kill(os.getppid(), signal.SIGHUP); "
            "time.sleep(1)']\n"
            f"results = launch_workers(worker, 1, {str(tmp_path)!r})\n"
            "print([r.returncode for r in results], signal.getsignal(signal.SIGHUP) is signal.SIG_IGN)\n")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.split("\n")[-2] == "[0] True"


def test_a_backup_of_the_other_trainer_is_refused_naming_it(tmp_path):
    """The multi-worker loop (``TrainingCheckpoint``) given ``model.fit``'s backups failed on a missing
    ``progress.json`` (and started afresh over a backup of Keras' own callback, deleting it at the end);
    ``model.fit`` (``AtomicBackupAndRestore``) given the loop's checkpoints failed on a missing
    ``training_metadata.json``. Each names the other trainer now."""
    images, labels = dm.synthetic_data(32)
    data = dm.dataset(images, labels, 16)
    fit(dm.mpw_classifier(), data, epochs=1, verbose=0,
        callbacks=[AtomicBackupAndRestore(str(tmp_path / "fit"), delete_checkpoint=False)])
    dm.mpw_classifier().fit(data, epochs=1, verbose=0,
                            callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "keras"),
                                                                        delete_checkpoint=False)])
    for folder in ("fit", "keras"):
        model = dm.mpw_classifier()
        model.optimizer.build(model.trainable_variables)
        with pytest.raises(OtherTrainerError, match=f"^`directory` '{tmp_path / folder}' holds backups of "
                                                    "model.fit .*resume them with model.fit"):
            TrainingCheckpoint(str(tmp_path / folder), model).restore()
        assert os.listdir(tmp_path / folder)

    trained = dm.mpw_classifier()
    trained.fit(data, epochs=1, verbose=0)
    TrainingCheckpoint(str(tmp_path / "loop"), trained).save(1, 0)
    with pytest.raises(OtherTrainerError, match=f"^`backup_dir` '{tmp_path / 'loop'}' holds checkpoints of "
                                                "training.distributed.fit's multi-worker loop .*otzoo train --workers"):
        fit(dm.mpw_classifier(), data, epochs=2, verbose=0, checkpoint_dir=str(tmp_path / "loop"))
