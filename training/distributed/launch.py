"""Launch N local worker processes of a ``MultiWorkerMirroredStrategy`` cluster on 127.0.0.1.

:func:`launch_workers` picks N free ports, writes each worker's ``TF_CONFIG`` (the same cluster, its own task
index), starts the same command in every process and waits for all of them. It is what ``otzoo train --workers N``
runs, and what the multi-worker tests use. It behaves like a small cluster manager: when one worker fails (a
non-zero exit, a kill) the others, which would wait forever in their next collective operation, are stopped after
``grace`` seconds; relaunching the same command then resumes from the last checkpoint (see
``training.distributed.checkpoints``), which :func:`run_cluster` does up to ``max_restarts`` times. The workers run in
sessions of their own; when the launcher is stopped (Ctrl-C, SIGTERM, SIGHUP) it kills them before it exits.

Every worker's stdout and stderr go to ``log_dir/worker-<i>.log``; ``echo=0`` also copies the chief's output, as
it comes, to this process's stdout (so ``otzoo train --workers N`` shows the chief's epochs while it trains).
:data:`SCRATCH_ENV` names the variable through which ``otzoo train --workers`` gives the non-chief workers a
temporary folder for the files every worker must write but only the chief's are kept
(``training.recipes.common.write_preset``).

On a real cluster each host runs the command itself with its own ``TF_CONFIG`` (``docs/distributed.md``).

Command line: ``python -m training.distributed.launch --workers 2 -- python my_script.py --epochs 3``.
"""
import argparse
import dataclasses
import json
import numbers
import os
import shutil
import signal
import socket
import codecs
import subprocess
import sys
import threading
import time

from ot_layers.validation import check_non_negative, check_output_path, check_positive, check_positive_int

HOST = "127.0.0.1"
# A folder outside the run's output directory where the non-chief workers write their copy of the results.
SCRATCH_ENV = "OTZOO_WORKER_SCRATCH"


def free_ports(count):
    """``count`` distinct TCP ports free on 127.0.0.1 now (held open together while they are chosen)."""
    count = check_positive_int("count", count)
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def cluster_tf_configs(num_workers, ports=None):
    """The ``TF_CONFIG`` dict of every worker of a local cluster (``worker`` tasks 0..N-1, worker 0 the chief)."""
    num_workers = check_positive_int("num_workers", num_workers)
    ports = free_ports(num_workers) if ports is None else list(ports)
    if len(ports) != num_workers:
        raise ValueError(f"`ports` must hold {num_workers} ports, got {len(ports)}.")
    if any(isinstance(port, bool) or not isinstance(port, numbers.Integral) or not 1 <= port <= 65535
           for port in ports):
        raise ValueError(f"`ports` must be TCP ports (integers in 1..65535), got {ports!r}.")
    workers = [f"{HOST}:{port}" for port in ports]
    return [{"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}} for i in range(num_workers)]


@dataclasses.dataclass
class WorkerResult:
    """How one worker ended: ``returncode`` (negative: killed by that signal; ``None``: still running when the
    launcher gave up), ``stopped`` (the launcher stopped it after another worker failed or the time ran out) and
    the path of its combined stdout/stderr log."""

    index: int
    returncode: object
    stopped: bool
    log_path: str

    def output(self):
        """The worker's log text."""
        with open(self.log_path, errors="replace") as handle:
            return handle.read()


def _stop(process):
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            process.kill()
        process.wait()


def _tee(pipe, log, stream):
    """Copy ``pipe`` (bytes) into ``log`` (a binary file) and ``stream`` (text) as it comes, until end of file."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        chunk = os.read(pipe.fileno(), 65536)  # what is there now, not a full line: progress bars show up live
        if not chunk:
            break
        log.write(chunk)
        log.flush()
        try:
            stream.write(decoder.decode(chunk))
            stream.flush()
        except (OSError, ValueError):  # the terminal went away or the stream was closed: keep the log going
            pass
    pipe.close()


def launch_workers(command, num_workers, log_dir, env=None, cpu_only=True, timeout=None, grace=10.0, cwd=None,
                   worker_env=None, echo=None, stream=None):
    """Run ``command`` (an argv list, e.g. ``[sys.executable, "train.py", "--epochs", "3"]``) in ``num_workers``
    processes forming one cluster on 127.0.0.1; returns a :class:`WorkerResult` per worker, in task order.

    ``log_dir``: where ``worker-<i>.log`` (stdout and stderr) are written. ``env``: extra environment variables for
    every worker; ``worker_env``: a function ``index -> dict`` of extra variables for one worker. ``cpu_only``:
    hide GPUs (``CUDA_VISIBLE_DEVICES=""``; the collectives then use gRPC ring all-reduce). ``timeout``: seconds
    after which every worker still running is killed (``None``: wait). ``grace``: seconds the other workers may
    still run after one has failed before they are killed (each worker runs in its own process group, so its
    children go with it). ``echo``: the index of a worker (0, the chief) whose output is also copied, as it
    comes, to ``stream`` (default ``sys.stdout``); its log file gets it all the same. Workers run with
    ``PYTHONUNBUFFERED=1`` so their logs and the echo follow the run.

    The workers run in sessions of their own, so a signal to this process does not reach them: while they run (when
    called from the main thread), SIGTERM and SIGHUP raise ``SystemExit(128 + signal)`` here, as Ctrl-C raises
    ``KeyboardInterrupt``, and every worker still running is killed before it propagates; the previous handlers are
    put back on return.
    """
    if not isinstance(command, (list, tuple)) or not command \
            or not all(isinstance(part, (str, os.PathLike)) for part in command):
        raise ValueError(f"`command` must be a non-empty argv list of strings, got {command!r}.")
    num_workers = check_positive_int("num_workers", num_workers)
    if timeout is not None:
        timeout = float(check_positive("timeout", timeout))
    grace = float(check_non_negative("grace", grace))
    if env is not None and not isinstance(env, dict):
        raise ValueError(f"`env` must be a dict of environment variables, got {env!r}.")
    log_dir = check_output_path("log_dir", log_dir, directory=True)
    if worker_env is not None and not callable(worker_env):
        raise ValueError(f"`worker_env` must be a function index -> dict, got {worker_env!r}.")
    if echo is not None and (isinstance(echo, bool) or not isinstance(echo, numbers.Integral)
                             or not 0 <= echo < num_workers):
        raise ValueError(f"`echo` must be a worker index in 0..{num_workers - 1} or None, got {echo!r}.")
    stream = sys.stdout if stream is None else stream
    os.makedirs(log_dir, exist_ok=True)
    configs = cluster_tf_configs(num_workers)
    processes, logs, paths, readers = [], [], [], []
    stopped = [False] * num_workers
    deadline = None if timeout is None else time.monotonic() + float(timeout)
    failed_at = None
    guard = _TerminationGuard()
    try:
        for index, config in enumerate(configs):
            child_env = dict(os.environ)
            child_env.update({"TF_CONFIG": json.dumps(config), "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"})
            if cpu_only:
                child_env["CUDA_VISIBLE_DEVICES"] = ""
            child_env.update({k: str(v) for k, v in (env or {}).items()})
            if worker_env is not None:
                child_env.update({k: str(v) for k, v in (worker_env(index) or {}).items()})
            path = os.path.join(log_dir, f"worker-{index}.log")
            log = open(path, "wb")
            logs.append(log)
            paths.append(path)
            echoed = index == echo
            processes.append(subprocess.Popen(list(command), env=child_env,
                                              stdout=subprocess.PIPE if echoed else log, stderr=subprocess.STDOUT,
                                              cwd=cwd, start_new_session=True))
            if echoed:
                readers.append(threading.Thread(target=_tee, args=(processes[-1].stdout, log, stream), daemon=True))
                readers[-1].start()
        while any(p.poll() is None for p in processes):
            now = time.monotonic()
            if failed_at is None and any(p.poll() not in (None, 0) for p in processes):
                failed_at = now
            if (failed_at is not None and now - failed_at > grace) or (deadline is not None and now > deadline):
                for index, process in enumerate(processes):
                    if process.poll() is None:
                        stopped[index] = True
                        _stop(process)
                break
            time.sleep(0.1)
    finally:
        # An exception here (Ctrl-C, SIGTERM, SIGHUP) must not leave workers behind: they run in their own sessions.
        guard.hold()  # a second signal must not cut this short
        try:
            for index, process in enumerate(processes):
                if process.poll() is None:
                    stopped[index] = True
                    _stop(process)
            for reader in readers:  # the rest of the echoed output (its process group is gone, so the pipe ends)
                reader.join(timeout=30)
            for log in logs:
                log.close()
        finally:
            guard.restore()
    return [WorkerResult(i, p.returncode, stopped[i], paths[i]) for i, p in enumerate(processes)]


# Signals that end the launcher (a job scheduler's SIGTERM, a closed terminal's SIGHUP) while its workers run.
TERMINATION_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class _TerminationGuard:
    """While the workers run, :data:`TERMINATION_SIGNALS` not ignored (``nohup`` ignores SIGHUP) raise
    ``SystemExit(128 + signal)`` (so the ``finally`` that stops the workers runs); while they are being stopped, a
    signal is held back and sent again once the previous handlers are back. Does nothing outside the main thread
    (where Python cannot set handlers)."""

    def __init__(self):
        self.previous, self.pending = None, []
        if threading.current_thread() is threading.main_thread():
            # an ignored signal stays ignored (nohup's SIGHUP: the terminal's closing must not stop the run)
            self.previous = {signum: signal.getsignal(signum) for signum in TERMINATION_SIGNALS
                             if signal.getsignal(signum) is not signal.SIG_IGN}
            for signum in self.previous:
                signal.signal(signum, self._raise)

    @staticmethod
    def _raise(signum, frame):
        raise SystemExit(128 + signum)

    def _hold(self, signum, frame):
        self.pending.append(signum)

    def hold(self):
        """From now on a signal is held back, not raised: the workers are being stopped."""
        for signum in self.previous or ():
            signal.signal(signum, self._hold)

    def restore(self):
        """Put the previous handlers back, then send this process a signal held back meanwhile."""
        for signum, handler in (self.previous or {}).items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(self.pending):
            os.kill(os.getpid(), signum)


def run_cluster(command, num_workers, log_dir, max_restarts=0, final_codes=(), **kwargs):
    """:func:`launch_workers` again, all workers together, while an attempt fails, at most ``max_restarts`` times
    -- what a cluster manager does; with checkpoints (``training.distributed.fit.fit(..., checkpoint_dir=...)``)
    every attempt resumes where the last complete checkpoint left off. ``final_codes``: exit statuses no restart
    can change (``otzoo``'s 2, a refused input): an attempt whose failed workers all exited with one of them is not
    repeated. Returns the results of every attempt, the last one last (``log_dir/attempt-<k>/worker-<i>.log``); the
    run succeeded when every worker of the last one exited 0."""
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"`max_restarts` must be an integer >= 0, got {max_restarts!r}.")
    if not isinstance(final_codes, (list, tuple, set, frozenset)) \
            or any(isinstance(code, bool) or not isinstance(code, numbers.Integral) for code in final_codes):
        raise ValueError(f"`final_codes` must be a collection of exit statuses, got {final_codes!r}.")
    attempts = []
    for attempt in range(max_restarts + 1):
        results = launch_workers(command, num_workers, os.path.join(log_dir, f"attempt-{attempt}"), **kwargs)
        attempts.append(results)
        failed = [r.returncode for r in results if r.returncode != 0]
        if not failed or all(code in final_codes for code in failed):
            break
    return attempts


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m training.distributed.launch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--log-dir", default="otzoo_workers")
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--max-restarts", type=int, default=0, help="relaunch all workers after a failure")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("argument command: give the command to run after --")
    if args.workers < 1:
        parser.error(f"argument --workers: must be an integer >= 1, got {args.workers}")
    if args.max_restarts < 0:
        parser.error(f"argument --max-restarts: must be an integer >= 0, got {args.max_restarts}")
    if args.timeout is not None and not args.timeout > 0:
        parser.error(f"argument --timeout: must be a number of seconds > 0, got {args.timeout}")
    try:  # a file, or a path below one, is refused before any worker starts
        os.makedirs(args.log_dir, exist_ok=True)
    except OSError as error:
        parser.error(f"argument --log-dir: cannot make the directory {args.log_dir!r} ({error.strerror})")
    if shutil.which(command[0]) is None:
        parser.error(f"argument command: no program {command[0]!r} (not an executable file, nor on PATH)")
    results = run_cluster(command, args.workers, args.log_dir, max_restarts=args.max_restarts,
                          timeout=args.timeout)[-1]
    for result in results:
        print(f"worker {result.index}: exit {result.returncode}{' (stopped)' if result.stopped else ''}, "
              f"log {result.log_path}")
    return 0 if all(r.returncode == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
