#!/usr/bin/env bash
# What a user installs: build the wheel, install it (no -e) into a fresh virtual environment outside the checkout,
# and from a directory where the checkout cannot be imported:
#   1. core install: scripts/check_core_install.py (every public layer fits a step and round-trips through .keras,
#      every preset loads and predicts, no extra's package is present);
#   2. core install: `otzoo export` stops with one line naming otzoo[export] (exit status 2), and `otzoo demo`
#      runs (its SavedModel is verified in a process that cannot import otzoo: site-packages must stay importable);
#   3. with the export extra: `otzoo export` writes the SavedModel and the ONNX file and prints the parity table;
#   4. without TensorFlow, in a second fresh environment (the wheel installed with --no-deps beside Keras, NumPy,
#      SciPy, POT and JAX, as docs/backends.md says): scripts/check_core_install.py on JAX, `otzoo list` with no
#      backend chosen stops with one line naming the backend (exit status 2), and `otzoo --backend jax demo` saves
#      a fine-tuned preset that `otzoo export` of the first environment (TensorFlow) exports with parity.
# Steps 2, 3 and 4's demo read Fashion-MNIST (scripts/setup.sh installs it); they are skipped with a warning without
# it.
# pip's cache serves what it can of the wheels scripts/setup.sh downloaded (where the index allows caching).
# About 7 minutes on 2 cores, 2 of them installing TensorFlow. KEEP_WHEEL_CHECK=1 keeps the temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/otzoo-wheel.XXXXXX")
[ "${KEEP_WHEEL_CHECK:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
export TF_CPP_MIN_LOG_LEVEL=2 PIP_DISABLE_PIP_VERSION_CHECK=1
unset PYTHONPATH
start=$SECONDS
step() { echo "== check_wheel [$((SECONDS - start)) s] $*"; }
# pip -q, less the warnings about index locations that have no page for a package (a machine's local mirrors).
pip_install() { "$1" -m pip install -q "${@:2}" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

step "building the wheel"
"$PY" -m pip wheel -q --no-deps -w "$WORK/dist" "$ROOT"
WHEEL=$(ls "$WORK"/dist/otzoo-*.whl)
echo "$(basename "$WHEEL") ($(du -h "$WHEEL" | cut -f1))"

step "installing it (core) into a fresh virtual environment in $WORK/venv"
"$PY" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
OTZOO=$WORK/venv/bin/otzoo
pip_install "$VPY" "$WHEEL"
mkdir -p "$WORK/run" && cd "$WORK/run"  # outside the checkout: only the installed otzoo can be imported

step "core install: layers, presets, .keras round trip (scripts/check_core_install.py)"
"$VPY" "$ROOT/scripts/check_core_install.py"

step "core install: otzoo export without the export extra"
rc=0
"$OTZOO" export resnet20_mpw_fashion_mnist --out "$WORK/export-core" >"$WORK/export-core.out" 2>"$WORK/export-core.err" || rc=$?
errors=$(grep -c "^otzoo export: error: .*pip install \"otzoo\[export\]\"$" "$WORK/export-core.err" || true)
if [ "$rc" -ne 2 ] || [ "$errors" -ne 1 ] || grep -q "Traceback" "$WORK/export-core.err"; then
  echo "FAIL: expected exit status 2 and one line naming otzoo[export]; got $rc:" >&2
  cat "$WORK/export-core.out" "$WORK/export-core.err" >&2
  exit 1
fi
grep "otzoo\[export\]" "$WORK/export-core.err"

step "without TensorFlow: the wheel (--no-deps) beside Keras, NumPy, SciPy, POT and JAX in $WORK/venv-jax"
"$PY" -m venv "$WORK/venv-jax"
JPY=$WORK/venv-jax/bin/python
pip_install "$JPY" "keras>=3.15,<3.16" numpy scipy "pot>=0.9.5" "jax[cpu]"
pip_install "$JPY" --no-deps "$WHEEL"
KERAS_BACKEND=jax "$JPY" "$ROOT/scripts/check_core_install.py" --without-tensorflow

step "without TensorFlow: otzoo with no backend chosen"
rc=0
env -u KERAS_BACKEND KERAS_HOME="$WORK/keras-home" "$WORK/venv-jax/bin/otzoo" list >"$WORK/list.out" 2>"$WORK/list.err" \
  || rc=$?
if [ "$rc" -ne 2 ] || [ "$(wc -l <"$WORK/list.err")" -ne 1 ] \
   || ! grep -q "^otzoo: error: backend: Keras runs on tensorflow .*--backend jax" "$WORK/list.err"; then
  echo "FAIL: expected exit status 2 and one line naming the backend; got $rc:" >&2
  cat "$WORK/list.out" "$WORK/list.err" >&2
  exit 1
fi
cat "$WORK/list.err"

FMNIST_FOUND=0
for dir in "${OTZOO_FASHION_MNIST:-}" /usr/share/datasets/fashion-mnist "${KERAS_HOME:-$HOME/.keras}/datasets/fashion-mnist"; do
  [ -n "$dir" ] && [ -f "$dir/t10k-images-idx3-ubyte.gz" ] && FMNIST_FOUND=1
done
if [ "$FMNIST_FOUND" = 0 ]; then
  echo "warning: Fashion-MNIST is not installed; otzoo demo and otzoo export were not run from the wheel" >&2
  step "done"
  exit 0
fi

step "core install: otzoo demo"
"$OTZOO" demo --limit 512 --test-limit 512 --out "$WORK/demo"
test -f "$WORK/demo/saved_model/models.config"

step "installing the export extra into the same environment"
pip_install "$VPY" "$WHEEL[export]"

step "with otzoo[export]: otzoo export"
"$OTZOO" export resnet20_mpw_fashion_mnist --out "$WORK/export" | tee "$WORK/export.out"
grep -q "^parity holds" "$WORK/export.out"
test -f "$WORK/export/resnet20_mpw_fashion_mnist.onnx"
test -f "$WORK/export/resnet20_mpw_fashion_mnist/1/assets.extra/tf_serving_warmup_requests"

step "without TensorFlow: otzoo --backend jax demo, then otzoo export of its preset with TensorFlow"
"$WORK/venv-jax/bin/otzoo" --backend jax demo --limit 256 --test-limit 512 --out "$WORK/demo-jax" | tee "$WORK/demo-jax.out"
grep -q "^4\. zoo.save_preset -> $WORK/demo-jax/fine_tuned" "$WORK/demo-jax.out"
"$OTZOO" export "$WORK/demo-jax/fine_tuned" --out "$WORK/export-jax" | tee "$WORK/export-jax.out"
grep -q "^parity holds" "$WORK/export-jax.out"

step "done: the wheel installs and runs, core, with otzoo[export], and on JAX without TensorFlow"
