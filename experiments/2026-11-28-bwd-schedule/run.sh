#!/usr/bin/env bash
# bwd_wgmma_fused's tile schedule against an earlier commit's: memcheck over the odd shapes, then the sweep (fp16 B1 H32
# N4096, D 64/128, causal and not, beside bwd_wgmma_overlap and SDPA cuDNN; CUPTI, one process each) for this tree and
# for the tree at OLD (a directory holding that commit's numba_attn/ and experiments/2026-11-27-bwd-wgmma/).
# NEW: a directory holding this tree's two (default: the project root).
# Usage, from the project root: OUT=dir OLD=dir [NEW=dir] bash experiments/2026-11-28-bwd-schedule/run.sh
set -u
sweep=experiments/2026-11-27-bwd-wgmma/sweep.py
out=${OUT:-/tmp/bwd-schedule}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
cfg='{"bwd_wgmma_overlap 32/64/2": {"Br": 32, "Bc": 64, "stages": 2}, "bwd_wgmma_fused": {}}'
if [ "${MEMCHECK:-1}" = 1 ]; then
  timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 "${NEW:-.}/experiments/2026-11-27-bwd-wgmma/sanitize.py" \
    --phases bwd_wgmma_fused > "$out/memcheck.txt" 2>&1
  echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
fi
timeout 240 python3 "${NEW:-.}/$sweep" --out "$out/sweep-new.json" --configs "$cfg" > "$out/sweep-new.txt" 2>&1
echo "new rc $?"; grep -v -i warn "$out/sweep-new.txt" | tail -6
if [ -n "${OLD:-}" ]; then
  timeout 240 python3 "$OLD/$sweep" --out "$out/sweep-old.json" --configs "$cfg" > "$out/sweep-old.txt" 2>&1
  echo "old rc $?"; grep -v -i warn "$out/sweep-old.txt" | tail -6
fi
