#!/usr/bin/env bash
# After the dK/dV walk took the block mask's column lists: the wgmma backward's tests with the CUDA backend,
# sanitize.py under memcheck, bwd_window.py with bwd_wgmma_overlap.
# Usage, from the project root with numba-cuda working: OUT=dir bash experiments/2026-11-27-bwd-wgmma/run3.sh
set -u
here=experiments/2026-11-27-bwd-wgmma
out=${OUT:-/tmp/bwd-wgmma-3}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
w=$(( $(nproc) < 16 ? $(nproc) : 16 ))
timeout 150 python3 -m pytest --full -q -p no:cacheprovider -n "$w" tests/test_backward.py tests/test_variants.py \
  -k "wgmma or column_lists or host_twin" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -2 "$out/tests.txt"
timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 $here/sanitize.py > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
timeout 150 python3 experiments/2026-11-27-bwd-window/bwd_window.py --phase bwd_wgmma_overlap --out "$out/window.json" \
  > "$out/window.txt" 2>&1
echo "window rc $?"; grep -v -i warn "$out/window.txt" | tail -4 | cut -c1-200
