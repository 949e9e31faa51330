#!/usr/bin/env bash
# After a presets call of scripts/gpu_lease.sh, here (the machine with the checkout): keep what the call returned,
# in the checkout, for the next call and for the presets. A session's lease (15 minutes of device time) is shorter
# than the protocol's runs take, so nothing may live only on the GPU machine or in the ignored gpu_runs/ folder:
#
#     bash scripts/gpu_keep.sh FILES_AT      # the folder where the call's $OUT files landed
#
# 1. the run records (experiments/results/gpu_presets/) and the call's log (experiments/results/gpu_presets_logs/);
# 2. the unfinished runs' newest backups (gpu_resume.tgz.*, 15 MiB parts) in experiments/results/gpu_resume/,
#    replacing the last call's: tracked files travel with the working tree, so the next presets call resumes them
#    without a carry. The working tree may carry 64 MiB: the checkout (about 15 MB), .whl (5 MB) and .fashion-mnist
#    (30 MB) leave about 14 MB for these parts, about 2.4 MB a run: PRESETS_WORKERS=4 keeps within it;
# 3. each preset's finished seed-0 run, shipped into zoo/presets (experiments/gpu_presets.py ship: the card's
#    protocol gives the seeds recorded so far; a preset shipped before has its protocol brought up to date).
# Then bring README.md's preset table to the shipped cards (tests/test_readme.py checks it) and commit:
# git add -A experiments/results zoo/presets README.md && git commit.
set -euo pipefail
cd "$(dirname "$0")/.."
from="${1:?usage: gpu_keep.sh FILES_AT (the folder holding gpu_presets.tgz and gpu_resume.tgz.*)}"
python="${PYTHON:-.venv/bin/python}"
[ -f "$from/gpu_presets.tgz" ] || { echo "gpu_keep.sh: no gpu_presets.tgz in $from" >&2; exit 2; }
mkdir -p gpu_runs experiments/results/gpu_presets_logs
tar xzf "$from/gpu_presets.tgz"  # the records, and gpu_runs/PRESET-seed0 for each finished seed 0
if [ -f "$from/presets.log" ]; then
    cp "$from/presets.log" "experiments/results/gpu_presets_logs/presets_$(date -u +%Y%m%dT%H%M%S).log"
fi
keep=experiments/results/gpu_resume
rm -rf "$keep"
unfinished=$(cat "$from"/gpu_resume.tgz.* 2>/dev/null | tar tzf - 2>/dev/null | cut -d/ -f2 | sort -u | tr '\n' ' ' || true)
if [ -n "${unfinished// }" ]; then
    mkdir -p "$keep" && cp "$from"/gpu_resume.tgz.* "$keep"/
    echo "kept the unfinished runs in $keep ($(du -sh "$keep" | cut -f1)): $unfinished"
else
    echo "no unfinished runs"
fi
# then ship (a refusal stops here, with the unfinished runs kept)
"$python" experiments/gpu_presets.py ship --results experiments/results/gpu_presets --runs gpu_runs --to zoo/presets
"$python" experiments/gpu_presets.py report --results experiments/results/gpu_presets --markdown /dev/stdout \
    | sed -n '/^|/p'
