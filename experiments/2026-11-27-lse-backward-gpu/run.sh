#!/usr/bin/env bash
# The log-sum-exp, sinks, varlen variants, the backward family and autograd on a GPU: `tests` (their tests with the
# CUDA backend, then sanitize.py under memcheck) or `train` (experiments/2026-11-27-train/train.py, 300 steps).
# Usage, from the project root with numba-cuda working: OUT=dir bash experiments/2026-11-27-lse-backward-gpu/run.sh tests|train
set -u
here=experiments/2026-11-27-lse-backward-gpu
out=${OUT:-/tmp/lse-backward}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu-$1.txt"
case $1 in
tests)
  w=$(( $(nproc) < 16 ? $(nproc) : 16 ))
  timeout 260 python3 -m pytest --full -q -p no:cacheprovider -n "$w" tests/test_lse.py tests/test_sinks.py \
    tests/test_backward.py tests/test_backward_reference.py tests/test_autograd.py tests/test_variants_tc.py \
    tests/test_varlen.py tests/test_transformers.py > "$out/tests.txt" 2>&1
  echo "tests rc $?"; tail -5 "$out/tests.txt"
  timeout 260 compute-sanitizer --tool memcheck --print-limit 5 python3 $here/sanitize.py > "$out/memcheck.txt" 2>&1
  echo "memcheck rc $?"; grep -v -i warn "$out/memcheck.txt" | tail -8;;
train)
  timeout 560 python3 experiments/2026-11-27-train/train.py --out "$out/train.json" --plot "$out/loss.png" \
    > "$out/train.txt" 2>&1
  echo "train rc $?"; grep -v -i warn "$out/train.txt" | tail -20;;
esac
