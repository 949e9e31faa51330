"""The per-layer checks on every Keras backend: each script in ``tests/backends/`` runs in a fresh process under
``KERAS_BACKEND`` = ``jax``, ``torch`` and ``tensorflow`` (the fast suite runs two JAX cells, ``-m slow`` the rest,
of which CI runs the solvers' and the resume cells on JAX and PyTorch; the TensorFlow suite checks the same layers in more detail).
A script prints one JSON line of measurements and exits non-zero when one fails (values against POT / NumPy closed
forms, gradients against central finite differences, compiled against eager, ``fit``, ``.keras`` round trip, mixed
precision). The same matrix runs without pytest through ``tests/backends/run_checks.py`` (the GPU machine's way)."""
import importlib.metadata
import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(name, *parts):
    """A script of this checkout that is no package module, loaded by its path."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, *parts))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_checks = _load("run_checks", "tests", "backends", "run_checks.py")  # the matrix runner, also run without pytest

CHECKS = run_checks.CHECKS
# In the fast suite: JAX (the backend of the GPU runs) without TensorFlow, and its keras.distribution data
# parallelism; every other cell (20 s to several minutes each on JAX, which compiles each solver loop) is marked
# slow.
FAST_JAX_CHECKS = {"check_without_tensorflow.py", "check_data_parallel.py"}
# CI's slow job runs the two solvers' checks and the resume check on JAX and PyTorch; the other cells are marked
# `long` (beyond CI's 90 minutes; `pytest -m slow` runs them all). The TensorFlow cells repeat what the TensorFlow
# suite checks in detail.
CI_CHECKS = {"check_sinkhorn.py", "check_emd.py", "check_resume.py"}
INSTALLED = {backend: importlib.util.find_spec(backend) is not None for backend in ("jax", "torch", "tensorflow")}


def _cell(check, backend):
    marks = [] if backend == "jax" and check in FAST_JAX_CHECKS else [pytest.mark.slow]
    if marks and not (backend in ("jax", "torch") and check in CI_CHECKS):
        marks.append(pytest.mark.long)
    marks.append(pytest.mark.skipif(not INSTALLED[backend], reason=f"{backend} not installed"))
    return pytest.param(check, backend, marks=marks, id=f"{check}-{backend}")


# Cells whose script only reports that the check does not apply (the matrix runner keeps them in its summary).
NOT_APPLICABLE = {("check_data_parallel.py", "torch"), ("check_data_parallel.py", "tensorflow"),
                  ("check_without_tensorflow.py", "tensorflow")}


@pytest.mark.parametrize("check, backend", [_cell(c, b) for b in ("jax", "torch", "tensorflow") for c in CHECKS
                                            if (c, b) not in NOT_APPLICABLE])
def test_check_passes_on_backend(check, backend, tmp_path):
    cell = run_checks.run_check(check, backend, tmp_path)
    assert cell["report"], f"{check} printed no report under {backend}:\n{cell['stderr_tail']}"
    assert "not_applicable" not in cell["report"], cell["report"]
    assert cell["passed"], f"{check} on {backend}: {cell['failures']}\n{cell['stderr_tail']}"


def test_runner_time_limit_lists_the_cells_it_did_not_start(tmp_path, capsys):
    """The runner the GPU machine uses (no pytest there): past ``--time-limit`` it starts no check, marks every cell
    "not run" in its JSON summary and does not count them as failures."""
    out = tmp_path / "matrix.json"
    status = run_checks.main(["--backends", "jax", "torch", "--checks", "check_sinkhorn.py", "check_emd.py",
                              "--time-limit", "-1", "--out", str(out)])
    summary = json.loads(out.read_text())
    assert status == 0
    assert (summary["passed"], summary["failed"], summary["not_run"]) == (0, 0, 4)
    assert {(c["backend"], c["check"]) for c in summary["cells"]} == {
        (b, c) for b in ("jax", "torch") for c in ("check_sinkhorn.py", "check_emd.py")}
    assert "0 passed, 0 failed, 4 not run" in capsys.readouterr().out
    assert summary["versions"]["keras"] == importlib.metadata.version("keras")


def test_child_processes_keep_the_callers_python_path(tmp_path, monkeypatch):
    """On the GPU machine Keras, POT and OTT-JAX are found only through ``PYTHONPATH`` (the carried wheels are
    installed in a folder of their own): the check and benchmark processes must put the checkout first and keep
    the caller's entries after it."""
    carried = str(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", carried)
    env = run_checks.check_environment("jax", tmp_path)
    assert env["PYTHONPATH"].split(os.pathsep) == [run_checks.ROOT, run_checks.HERE, carried]
    assert (env["KERAS_BACKEND"], env["KERAS_HOME"]) == ("jax", str(tmp_path))
    accelerator = _load("benchmark_accelerator", "benchmarks", "accelerator.py")
    worker = accelerator.worker_env(KERAS_BACKEND="torch")
    assert worker["PYTHONPATH"].split(os.pathsep) == [ROOT, carried] and worker["KERAS_BACKEND"] == "torch"
    monkeypatch.delenv("PYTHONPATH")
    assert run_checks.check_environment("jax", tmp_path)["PYTHONPATH"].split(os.pathsep) == [
        run_checks.ROOT, run_checks.HERE]
