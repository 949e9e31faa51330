#!/usr/bin/env bash
# What a GPU machine without TensorFlow, Keras or POT needs to run otzoo on Keras' JAX (or PyTorch) backend, put in
# two folders of this checkout that git ignores: .whl/ (Python 3.12 wheels of Keras and its small dependencies, of
# POT, and of OTT-JAX with its pure-Python dependencies, the benchmarks' peer; the versions this project is tested
# with; POT 0.9.5, the oldest it supports, because 0.9.7's wheel carries a 175 MB library otzoo does not use and the
# working tree may carry 64 MiB) and .fashion-mnist/ (the four IDX files). Carry both with the working tree; on that
# machine scripts/gpu_lease.sh installs the wheels and runs one step of the GPU work.
#
#     bash scripts/device_carry.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
for folder in /.whl/ /.fashion-mnist/; do
    grep -qxF "$folder" "$exclude" 2>/dev/null || echo "$folder" >> "$exclude"
done
rm -rf .whl && mkdir -p .whl .fashion-mnist
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl keras==3.15.1 optree==0.20.0 namex==0.1.0 POT==0.9.5 \
    ott-jax==0.6.0 jaxopt==0.8.5 lineax==0.1.1 optax==0.2.8 equinox==0.13.8 jaxtyping==0.3.11 wadler_lindig==0.1.8 \
    absl-py==2.5.1
source="${OTZOO_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}"
cp "$source"/*-ubyte.gz .fashion-mnist/
du -sh .whl .fashion-mnist
echo 'on the GPU machine: bash scripts/gpu_lease.sh matrix|benchmarks|presets (it installs .whl/ first)'
