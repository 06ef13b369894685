#!/usr/bin/env bash
# The wgmma backward phases with mask functions on a GPU: their tests with the CUDA backend, sanitize.py (plain,
# a window, documents) under memcheck, sweep.py (plain), then bwd_window.py with bwd_wgmma_overlap.
# Usage, from the project root with numba-cuda working: OUT=dir bash experiments/2026-11-27-bwd-wgmma/run2.sh
set -u
here=experiments/2026-11-27-bwd-wgmma
out=${OUT:-/tmp/bwd-wgmma-2}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
w=$(( $(nproc) < 16 ? $(nproc) : 16 ))
timeout 200 python3 -m pytest --full -q -p no:cacheprovider -n "$w" tests/test_wgmma.py tests/test_backward.py \
  -k "wgmma" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -3 "$out/tests.txt"
timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 $here/sanitize.py > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
timeout 150 python3 $here/sweep.py --out "$out/sweep.json" > "$out/sweep.txt" 2>&1
echo "sweep rc $?"; grep -v -i warn "$out/sweep.txt" | tail -4
timeout 150 python3 experiments/2026-11-27-bwd-window/bwd_window.py --phase bwd_wgmma_overlap --out "$out/window.json" \
  > "$out/window.txt" 2>&1
echo "window rc $?"; grep -v -i warn "$out/window.txt" | tail -4
