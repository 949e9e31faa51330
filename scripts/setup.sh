#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with otzoo (editable, all extras, test tools) installed,
# and, where apt-get exists, Debian's packages it lacks: Fashion-MNIST (dataset-fashion-mnist) and venv's pip
# bootstrap (python3.X-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
  echo "otzoo needs Python 3.10 or newer; python3 is $(python3 --version 2>&1)" >&2; exit 2; }
SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo"
packages=()
FMNIST=/usr/share/datasets/fashion-mnist
[ -f "$FMNIST/train-images-idx3-ubyte.gz" ] || packages+=(dataset-fashion-mnist)
# Debian and Ubuntu ship venv's pip bootstrap apart (python3-venv, or python3.X-venv)
[ -x .venv/bin/python ] || python3 -c 'import ensurepip, venv' 2>/dev/null \
  || packages+=("python$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')-venv")
if [ ${#packages[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1; then
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${packages[@]}" >/dev/null || \
    echo "warning: could not install ${packages[*]}; without dataset-fashion-mnist the Fashion-MNIST runs are" \
         "skipped" >&2
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# otzoo 0.1 pinned tensorflow-cpu; both wheels own the same `tensorflow` package, so drop the old one first.
if .venv/bin/python -m pip show -q tensorflow-cpu >/dev/null 2>&1; then
  .venv/bin/python -m pip uninstall -y -q tensorflow-cpu
fi
# Development: the editable checkout with every feature's extra, JAX's CPU build and PyTorch (the backend
# matrix, tests/test_backend_matrix.py) and the test tools (scripts/check_wheel.sh checks
# what a user gets from the wheel, core alone and with an extra).
.venv/bin/python -m pip install -q -e ".[all,dev,backends]"
# Reference implementations some tests compare against (pytorch-metric-learning needs torch); the tests that use
# them are skipped where they cannot be installed.
.venv/bin/python -m pip install -q -e ".[all,dev,backends,reference]" || echo "warning: reference packages not installed" >&2
