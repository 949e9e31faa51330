"""The per-layer checks on every Keras backend: each script in ``tests/backends/`` runs in a fresh process under
``KERAS_BACKEND`` = ``jax`` (in the fast suite: the backend the GPU runs use), ``torch`` and ``tensorflow`` (in the
slow job, which CI runs too; the TensorFlow suite checks the same layers in more detail). A script prints one JSON
line of measurements and exits non-zero when one fails (values against POT / NumPy closed forms, gradients against
central finite differences, compiled against eager, ``fit``, ``.keras`` round trip, mixed precision)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CHECKS = sorted(name for name in os.listdir(os.path.join(HERE, "backends")) if name.startswith("check_"))
BACKENDS = [
    pytest.param("jax", marks=pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax not installed")),
    pytest.param("torch", marks=[pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                                                      reason="torch not installed")]),
    pytest.param("tensorflow", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("check", CHECKS)
def test_check_passes_on_backend(check, backend, tmp_path):
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3",
               KERAS_HOME=str(tmp_path))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "backends", check)], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"{check} printed no report under {backend}:\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1])
    assert report["backend"] == backend
    assert proc.returncode == 0 and not report["failures"], f"{check} on {backend}: {report['failures']}\n" \
                                                            f"{proc.stderr[-3000:]}"
