#!/usr/bin/env bash
# bwd_atomic_dq and the backward variants on a GPU: their tests with the CUDA backend, sanitize.py under memcheck,
# then bwd_time.py (CUPTI, beside SDPA's backward).
# Usage, from the project root with numba-cuda working: OUT=dir bash experiments/2026-11-27-bwd-atomic-variants/run.sh
set -u
here=experiments/2026-11-27-bwd-atomic-variants
out=${OUT:-/tmp/bwd-atomic-variants}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
w=$(( $(nproc) < 16 ? $(nproc) : 16 ))
timeout 200 python3 -m pytest --full -q -p no:cacheprovider -n "$w" tests/test_backward.py tests/test_autograd.py \
  tests/test_backward_reference.py tests/test_transformers.py > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -3 "$out/tests.txt"
timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 $here/sanitize.py > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -8
timeout 160 python3 $here/bwd_time.py --out "$out/bwd.json" > "$out/bwd.txt" 2>&1
echo "time rc $?"; grep -v -i warn "$out/bwd.txt" | tail -6
