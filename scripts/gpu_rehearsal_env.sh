#!/usr/bin/env bash
# A CPU stand-in for the GPU machine's Python, to rehearse scripts/gpu_lease.sh before a lease: a virtual environment
# of Python 3.12 with the versions that machine's image holds (jax 0.11.2, torch 2.11.0, numpy 2.5.2, read from the
# device tool's package list), and no TensorFlow or protobuf. Keras, POT and OTT-JAX are not installed: gpu_lease.sh
# installs the carried wheels (.whl/, from scripts/device_carry.sh) into a folder of their own and finds them through
# PYTHONPATH, as it does there.
#
#     PY312=/path/to/python3.12 bash scripts/gpu_rehearsal_env.sh [VENV]     (default VENV: /tmp/gpu-rehearsal)
#     OUT=/tmp/gpu PYTHON=/tmp/gpu-rehearsal/bin/python bash scripts/gpu_lease.sh matrix|benchmarks|presets
set -euo pipefail
python312="${PY312:-python3.12}"
venv="${1:-/tmp/gpu-rehearsal}"
"$python312" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' || {
    echo "PY312 must name a Python 3.12 interpreter (the GPU machine's), got $python312" >&2; exit 2; }
"$python312" -m venv "$venv"
# torch 2.11.0 from the package index is the CUDA build, as there; without a GPU it computes on the CPU.
"$venv/bin/python" -m pip install -q torch==2.11.0 jax==0.11.2 jaxlib==0.11.2 numpy==2.5.2 scipy h5py ml-dtypes \
    rich packaging
"$venv/bin/python" -c 'import jax, numpy, torch; print("jax", jax.__version__, "torch", torch.__version__,
                                                        "numpy", numpy.__version__)'
