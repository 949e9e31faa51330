#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with otzoo (editable, all extras, test tools) installed,
# and, where apt-get exists, Debian's packages it lacks: Fashion-MNIST (dataset-fashion-mnist) and venv's pip
# bootstrap (python3.X-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo"
apt_install() {  # apt_install PACKAGE: where apt-get exists; the caller decides what a failure means
  command -v apt-get >/dev/null 2>&1 || return 1
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "$1" >/dev/null
}
# A usable .venv (its Python runs pip) is kept; else it is made again from python3, which must be 3.10 or newer
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || {
    echo "otzoo needs Python 3.10 or newer; python3 is $(python3 --version 2>&1)" >&2; exit 2; }
  # Debian and Ubuntu ship venv's pip bootstrap apart, as python3.X-venv
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    venv_package="python$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')-venv"
    apt_install "$venv_package" || {
      echo "python3 cannot make a virtual environment (no ensurepip): install $venv_package, then run again" >&2
      exit 2; }
  fi
  python3 -m venv --clear .venv
fi
FMNIST=/usr/share/datasets/fashion-mnist
if [ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ]; then
  apt_install dataset-fashion-mnist || \
    echo "warning: could not install dataset-fashion-mnist; Fashion-MNIST runs will be skipped" >&2
fi
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
