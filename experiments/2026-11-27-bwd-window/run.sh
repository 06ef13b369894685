#!/usr/bin/env bash
# The backward and decode variants on a GPU after block-sparse bwd_mma, sinks gradients and decode key spans:
# their tests with the CUDA backend, the backward variants under memcheck, decode with a window (memcheck, tests,
# times), then bwd_window.py.
# Usage, from the project root with numba-cuda working: OUT=dir bash experiments/2026-11-27-bwd-window/run.sh
set -u
here=experiments/2026-11-27-bwd-window
out=${OUT:-/tmp/bwd-window}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
w=$(( $(nproc) < 16 ? $(nproc) : 16 ))
timeout 240 python3 -m pytest --full -q -p no:cacheprovider -n "$w" tests/test_backward.py tests/test_autograd.py \
  tests/test_sinks.py tests/test_decode_variants.py tests/test_transformers.py > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -3 "$out/tests.txt"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 experiments/2026-11-27-bwd-atomic-variants/sanitize.py \
  > "$out/memcheck-backward.txt" 2>&1
echo "memcheck backward rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck-backward.txt" | tail -4
OUT=$out/decode-window bash experiments/2026-11-27-decode-window/run.sh
timeout 150 python3 $here/bwd_window.py --out "$out/window.json" > "$out/window.txt" 2>&1
echo "bwd window rc $?"; grep -v -i warn "$out/window.txt" | tail -4
