#!/usr/bin/env bash
# bwd_wgmma_fused on a GPU: its tests with the CUDA backend, the odd shapes under memcheck, and its ring depths beside
# bwd_wgmma_overlap and SDPA cuDNN's backward (CUPTI, one process).
# Usage, from the project root with numba-cuda working: OUT=dir bash experiments/2026-11-27-bwd-fused/run.sh
set -u
old=experiments/2026-11-27-bwd-wgmma
out=${OUT:-/tmp/bwd-fused}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
w=$(( $(nproc) < 16 ? $(nproc) : 16 ))
if [ "${TESTS:-1}" = 1 ]; then
  timeout 240 python3 -m pytest --full -q -p no:cacheprovider -n "$w" tests/test_backward.py tests/test_bulk.py \
    -k "fused or bulk" > "$out/tests.txt" 2>&1
  echo "tests rc $?"; tail -3 "$out/tests.txt"
  timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 $old/sanitize.py --phases bwd_wgmma_fused \
    > "$out/memcheck.txt" 2>&1
  echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
fi
default='{"bwd_wgmma_overlap 32/64/2": {"Br": 32, "Bc": 64, "stages": 2}, "bwd_wgmma_fused 2": {"stages": 2}, "bwd_wgmma_fused 3": {"stages": 3}}'
timeout 300 python3 $old/sweep.py --out "$out/sweep.json" --configs "${CONFIGS:-$default}" > "$out/sweep.txt" 2>&1
echo "sweep rc $?"; grep -v -i warn "$out/sweep.txt" | tail -6
