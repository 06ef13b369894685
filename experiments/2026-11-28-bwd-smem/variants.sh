#!/usr/bin/env bash
# bwd_wgmma_ss's default against one variant of its parameters: memcheck of the variant over the odd shapes, the GPU
# tests, then the sweep of both beside SDPA cuDNN in one process (fp16, then bf16; B1 H32 N4096, causal and not;
# CUPTI; gradients checked against float64 first).
# Usage, from the project root: OUT=dir NAME=label PARAMS='{"dq": "bulk"}' [DIMS=64,128] bash variants.sh
# (red.sh and rs.sh name the two variants measured so far)
set -u
sweep=experiments/2026-11-27-bwd-wgmma/sweep.py
out=${OUT:-/tmp/bwd-variant}; mkdir -p "$out"
dims=${DIMS:-64,128}
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 experiments/2026-11-27-bwd-wgmma/sanitize.py \
  --phases bwd_wgmma_ss --dims "$dims" --params "$PARAMS" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
timeout 200 python3 -m pytest --full -q -x tests/test_bulk.py tests/test_backward.py -k "bulk or wgmma_ss" \
  > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests.txt"
cfg="{\"bwd_wgmma_ss\": {}, \"bwd_wgmma_ss $NAME\": $PARAMS}"
for dt in float16 bfloat16; do
  timeout 200 python3 "$sweep" --dtype $dt --dims "$dims" --out "$out/sweep-$dt.json" --configs "$cfg" \
    > "$out/sweep-$dt.txt" 2>&1
  echo "$dt rc $?"; grep '^{' "$out/sweep-$dt.txt"
done
gzip -f "$out"/*.txt
