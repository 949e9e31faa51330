#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with otzoo (editable, all extras, test tools) installed,
# and Fashion-MNIST from Debian's package where apt-get exists and the files are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
FMNIST=/usr/share/datasets/fashion-mnist
if [ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ] && command -v apt-get >/dev/null 2>&1; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null || \
    echo "warning: could not install dataset-fashion-mnist; Fashion-MNIST runs will be skipped" >&2
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
