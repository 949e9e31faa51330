"""The backend test matrix without pytest: every ``check_*.py`` beside this file, in a fresh process per check and
backend, its one-line JSON report collected into one file.

``tests/test_backend_matrix.py`` runs each cell through :func:`run_check`; this script is the same matrix where
pytest and otzoo's test dependencies are not installed (the GPU machine, which has JAX and PyTorch with CUDA and no
TensorFlow). A check that fails, prints no report or runs out of time is a failed cell; the script exits non-zero
when any cell failed. With ``--time-limit`` no new check starts once that many seconds have passed: the cells not run
are listed as such, so that a call on a machine lent for a few minutes ends in time and says what it left.

    python tests/backends/run_checks.py --backends jax torch --out matrix.json [--time-limit 480]
        [--block-tensorflow]   # as on a machine without TensorFlow (rehearsal on one that has it)
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHECKS = sorted(name for name in os.listdir(HERE) if name.startswith("check_") and name.endswith(".py"))
_BLOCKED_RUN = ("import runpy, sys; sys.path.insert(0, {here!r}); from no_tensorflow import block_tensorflow; "
                "block_tensorflow(); sys.argv = [{path!r}]; runpy.run_path({path!r}, run_name='__main__')")


def check_environment(backend, workdir):
    """The environment a check runs in: ``KERAS_BACKEND=backend``, ``KERAS_HOME=workdir``, and this checkout and
    this folder first on ``PYTHONPATH``, the caller's entries kept after them (on the GPU machine the carried
    packages are found through them)."""
    python_path = os.pathsep.join(filter(None, [ROOT, HERE, os.environ.get("PYTHONPATH")]))
    return dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=python_path, TF_CPP_MIN_LOG_LEVEL="3",
                KERAS_HOME=str(workdir))


def run_check(check, backend, workdir, block_tensorflow=False, timeout=900):
    """Runs ``check`` (a file name in this folder) under ``KERAS_BACKEND=backend`` in a fresh process, in
    ``workdir`` (also its ``KERAS_HOME``). Returns ``{"check", "backend", "passed", "seconds", "report",
    "failures", "stderr_tail"}``: ``report`` is the check's JSON line (``None`` if it printed none) and ``passed``
    needs exit status 0 and an empty failure list."""
    path = os.path.join(HERE, check)
    command = [sys.executable, "-c", _BLOCKED_RUN.format(here=HERE, path=path)] if block_tensorflow else \
        [sys.executable, path]
    env = check_environment(backend, workdir)
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=str(workdir), timeout=timeout)
        stdout, stderr, returncode = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
        stderr = f"timed out after {timeout} s"
        returncode = None
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    report = json.loads(lines[-1]) if lines else None
    failures = report["failures"] if report else ["no report"]
    return {"check": check, "backend": backend, "seconds": round(time.perf_counter() - start, 1),
            "passed": returncode == 0 and report is not None and report["backend"] == backend and not failures,
            "returncode": returncode, "failures": failures, "report": report, "stderr_tail": stderr[-3000:]}


def _devices(cells):
    """What each backend computed on (its checks' ``accelerators``, GPU names; ``cpu`` where none), for the record."""
    found = {}
    for cell in cells:
        if cell.get("report"):
            found.setdefault(cell["backend"], set()).update(cell["report"].get("accelerators") or ["cpu"])
    return {backend: sorted(names) for backend, names in found.items()}


def _versions(names=("keras", "jax", "jaxlib", "torch", "tensorflow", "numpy", "scipy", "POT")):
    """The installed versions of the packages the checks use (``None`` where one is missing), for the record."""
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"],
                        choices=["jax", "torch", "tensorflow"])
    parser.add_argument("--checks", nargs="+", default=CHECKS, choices=CHECKS, metavar="CHECK",
                        help="check files to run (default: all of them)")
    parser.add_argument("--out", help="JSON file for the matrix (default: print only)")
    parser.add_argument("--time-limit", type=float, help="start no check after this many seconds")
    parser.add_argument("--block-tensorflow", action="store_true",
                        help="make `import tensorflow` fail in the checks, as where it is not installed")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    cells = []
    for backend in args.backends:
        for check in args.checks:
            if args.time_limit is not None and time.perf_counter() - start > args.time_limit:
                cells.append({"check": check, "backend": backend, "passed": None, "not_run": "time limit"})
                print(f"{backend:<11}{check:<30}not run (time limit)", flush=True)
                continue
            with tempfile.TemporaryDirectory() as workdir:
                cell = run_check(check, backend, workdir, block_tensorflow=args.block_tensorflow)
            cells.append(cell)
            verdict = "passed" if cell["passed"] else f"FAILED {cell['failures']}"
            print(f"{backend:<11}{check:<30}{cell['seconds']:>7.1f} s  {verdict}", flush=True)
            if not cell["passed"]:
                print(cell["stderr_tail"], file=sys.stderr, flush=True)
    failed = [c for c in cells if c["passed"] is False]
    summary = {"python": platform.python_version(), "versions": _versions(), "devices": _devices(cells),
               "environment": {k: v for k, v in os.environ.items() if k.startswith(("JAX_", "XLA_", "KERAS_"))},
               "passed": sum(c["passed"] is True for c in cells), "failed": len(failed),
               "not_run": sum(c["passed"] is None for c in cells), "cells": cells}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as handle:
            json.dump(summary, handle, indent=1)
    print(f"{summary['passed']} passed, {summary['failed']} failed, {summary['not_run']} not run", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
