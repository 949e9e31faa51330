"""Run Python code in a child process where otzoo's packages cannot be imported: how TF Serving sees an export.

The child is the same interpreter (same TensorFlow, onnxruntime, NumPy) started with ``-I`` (no ``PYTHON*``
variables, no user site, no script or working directory on ``sys.path``), whose first statement puts a finder at
the front of ``sys.meta_path`` that refuses every module of :data:`BLOCKED_PACKAGES` by name. That alone keeps the
project out, wherever it lives: the finder runs before the path finder and the editable install's own finder
(which ``-I`` alone would keep). ``sys.path`` is left as it is: in a regular install the directory holding the
project's packages is ``site-packages``, which also holds NumPy and TensorFlow.
"""
import os
import subprocess
import sys
import tempfile

BLOCKED_PACKAGES = ("ot_layers", "zoo", "training", "export", "explain", "otzoo")
REPOSITORY_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PRELUDE = r'''
import sys as _sys


class _BlockProject:
    """Refuses the project's packages: the child must run with TensorFlow and onnxruntime alone."""
    blocked = frozenset(%(blocked)r)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"{name!r} is blocked: the export runs without otzoo", name=name)
        return None


_sys.meta_path.insert(0, _BlockProject())
del _sys, _BlockProject
'''


def isolated_command(code):
    """The ``argv`` prefix that runs ``code`` in an isolated child (append the script's arguments)."""
    prelude = _PRELUDE % {"blocked": tuple(BLOCKED_PACKAGES)}
    return [sys.executable, "-I", "-c", prelude + code]


def run_isolated(code, args=(), timeout=None):
    """Run ``code`` with ``args`` (``sys.argv[1:]``) in an isolated child; returns the ``CompletedProcess``
    (text stdout and stderr). The child's working directory is the system's temporary directory."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return subprocess.run(isolated_command(code) + [str(a) for a in args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=tempfile.gettempdir())
