#!/usr/bin/env bash
# One step of the GPU work, run on the GPU machine the `device` tool lends (JAX and PyTorch with CUDA, Python 3.12,
# no TensorFlow), in the copy of this checkout there, with .whl/ and .fashion-mnist/ carried (scripts/device_carry.sh
# fills them here). Each step fits one call (10 minutes) and writes what it measured under $OUT:
#
#     bash scripts/gpu_lease.sh matrix [SECONDS]      the backend checks on JAX and PyTorch (tests/backends/), float32
#                                                     matrix products at full precision (see below): matrix_gpu.json
#     bash scripts/gpu_lease.sh benchmarks            the MPW head (benchmarks/sinkhorn.py) and GSP
#                                                     (benchmarks/gsp_backends.py) beside OTT-JAX on the same GPU,
#                                                     and the solver checks at JAX's default precision (a record)
#     bash scripts/gpu_lease.sh presets [SECONDS]     experiments/gpu_presets.py through the JAX backend, resumable:
#                                                     gpu_presets.tgz holds the run records and seed 0's finished
#                                                     preset directories, gpu_resume.tgz.* every unfinished
#                                                     run's directory (its newest backup) in 15 MiB parts; the
#                                                     protocol stops between epochs at SECONDS and is killed at
#                                                     SECONDS + 60 s at the latest, so both are made in the call.
#                                                     After the call, here: bash scripts/gpu_keep.sh FILES_AT
#                                                     commits nothing but puts the records, seed 0's shipped
#                                                     presets and the unfinished runs (experiments/results/
#                                                     gpu_resume/) in the checkout, to commit: the next call,
#                                                     in this session or a later one, finds them in the working
#                                                     tree and resumes the unfinished runs (a warm machine's own
#                                                     gpu_runs, newer, is used where it holds runs).
#                                                     PRESETS_WORKERS (default 4) runs train side by side; the
#                                                     log's last line gives the epochs trained per minute.
#
# SECONDS (default 480) is when the step starts nothing new; BACKENDS="torch" runs the matrix of one backend and
# CHECKS="check_emd.py check_sinkhorn.py" some of its checks (the cells an earlier call left "not run");
# PRESETS_OPTIONS adds options to the protocol's run (a CPU-sized rehearsal:
# PRESETS_OPTIONS="--limit 1200 --presets resnet20_gap_fashion_mnist --budgets 1 2 --seeds 0"). Every step also
# writes gpu.txt (nvidia-smi's GPU, driver and CUDA) and its log. JAX runs float32 matrix products in TensorFloat-32
# on this GPU by default (about 3 decimal digits); the matrix step sets JAX_DEFAULT_MATMUL_PRECISION=highest because
# its checks compare float32 values with references at 1e-4 to 1e-5; mixed_bfloat16 is checked on its own
# (check_sinkhorn.py). The benchmarks and the presets keep the defaults a user gets.
#
# Rehearsal on a machine with TensorFlow (nothing installed, TensorFlow blocked from import in the checks):
#     OUT=/tmp/gpu PYTHON=.venv/bin/python OTZOO_REHEARSAL=1 bash scripts/gpu_lease.sh matrix
set -uo pipefail
cd "$(dirname "$0")/.."
step="${1:?usage: gpu_lease.sh matrix|benchmarks|presets [SECONDS]}"
limit="${2:-480}"
out="${OUT:?set OUT to the folder the results go to}"
python="${PYTHON:-python3}"
mkdir -p "$out"
block=()
if [ -n "${OTZOO_REHEARSAL:-}" ]; then
    block=(--block-tensorflow)
else
    install_wheels() {
        [ -f /tmp/site/.otzoo-wheels ] && return 0
        "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl/*.whl && touch /tmp/site/.otzoo-wheels
    }
    # once per machine, under a lock: two steps may run side by side in one call (matrix beside presets)
    (flock 9 && install_wheels) 9>/tmp/site.lock || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
fi
export OTZOO_FASHION_MNIST="${OTZOO_FASHION_MNIST:-$PWD/.fashion-mnist}"
# The CUDA version is looked up apart: under pipefail, grep -m1 closing the pipe fails nvidia-smi, and that failure
# once replaced the GPU's line by "no nvidia-smi"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$out/gpu.txt" 2>&1 \
    || echo "no nvidia-smi" > "$out/gpu.txt"
{ nvidia-smi 2>/dev/null | grep -m1 "CUDA Version"; } >> "$out/gpu.txt" || true

case "$step" in
    matrix)
        JAX_DEFAULT_MATMUL_PRECISION=highest "$python" tests/backends/run_checks.py --backends ${BACKENDS:-jax torch} \
            ${CHECKS:+--checks $CHECKS} --out "$out/matrix_gpu.json" --time-limit "$limit" "${block[@]}" 2>&1 \
            | tee "$out/matrix.log"
        ;;
    benchmarks)
        { "$python" benchmarks/sinkhorn.py --repeats 20 --out "$out/sinkhorn_gpu.json"
          "$python" benchmarks/gsp_backends.py --repeats 20 --out "$out/gsp_backends_gpu.json"
          # what a user's defaults give: the solver checks on JAX with TensorFloat-32 products (a record, not a gate)
          "$python" tests/backends/run_checks.py --backends jax --checks check_sinkhorn.py check_partial_transport.py \
              --out "$out/matrix_gpu_default_precision.json" "${block[@]}" || true; } 2>&1 | tee "$out/benchmarks.log"
        ;;
    presets)
        # The protocol stops between epochs when the next would pass the limit, judged by the slowest epoch seen;
        # a call's first epoch (compiling included) is started blind, so the protocol is killed 60 s past the limit
        # at the latest (each run's last finished epoch is backed up atomically) and the archive is made in time.
        # JAX's persistent compilation cache, on the machine's disk: every run of a preset and budget compiles the
        # same training step (the seed is data, not program), so the runs after the first one of a call, and those
        # of later calls while the machine stays warm, load it instead of compiling and autotuning it again.
        export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/otzoo-jax-cache}"
        mkdir -p experiments/results/gpu_presets gpu_runs
        # The unfinished runs of the last call, kept in the checkout by scripts/gpu_keep.sh (a session's lease is
        # shorter than the runs take), unless this machine still holds its own (warm from an earlier call).
        if [ -z "$(ls -A gpu_runs)" ] && compgen -G "experiments/results/gpu_resume/gpu_resume.tgz.*" >/dev/null; then
            cat experiments/results/gpu_resume/gpu_resume.tgz.* | tar xzf -
            echo "resuming the kept runs: $(ls gpu_runs | tr '\n' ' ')"
        fi
        KERAS_BACKEND=jax timeout "$((${limit%.*} + 60))" "$python" experiments/gpu_presets.py run \
            --results experiments/results/gpu_presets --runs gpu_runs --time-limit "$limit" \
            --workers "${PRESETS_WORKERS:-4}" ${PRESETS_OPTIONS:-} 2>&1 \
            | tail -200 > "$out/presets.log"
        # Two archives: the records and seed 0's finished preset directories (to commit), and the unfinished runs'
        # directories (to carry back as gpu_runs, so that the next call resumes them).
        finished=$(for card in gpu_runs/*-seed0/metadata.json; do if [ -f "$card" ]; then dirname "$card"; fi; done)
        tar czf "$out/gpu_presets.tgz" experiments/results/gpu_presets $finished
        # Each run's newest backup only (the one its `latest` names; the older one is kept on disk against a torn
        # write, which a finished archive cannot have): 2.4 MB a run. Split in 15 MiB parts (a returned file may
        # hold 16 MiB): here, cat gpu_resume.tgz.* | tar xzf -
        newest='import json, sys; print(json.load(open(sys.argv[1]))["checkpoint"])'  # what `latest` points at
        for backup in gpu_runs/*/backup; do
            [ -f "$backup/latest" ] || continue
            newest_dir="$backup/$("$python" -c "$newest" "$backup/latest")"
            find "$(dirname "$backup")" -path "$backup" -prune -o -type f -print
            echo "$backup/latest"
            find "$newest_dir" -type f
        done | tar czf - -T - | split -b 15m - "$out/gpu_resume.tgz."
        ;;
    *)
        echo "unknown step: $step (matrix, benchmarks or presets)" >&2
        exit 2
        ;;
esac
