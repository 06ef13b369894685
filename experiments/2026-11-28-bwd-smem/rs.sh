#!/usr/bin/env bash
# bwd_wgmma_ss's dV and dK with A from the registers at D64 (rs=True) against the Pᵀ and dSᵀ tiles (rs=False):
# memcheck of "rs" over the odd shapes, the GPU tests, then the sweep of both beside SDPA cuDNN in one process
# (fp16, then bf16; B1 H32 N4096 D64, causal and not; CUPTI; gradients checked against float64 first).
# Usage, from the project root: OUT=dir bash experiments/2026-11-28-bwd-smem/rs.sh
set -u
sweep=experiments/2026-11-27-bwd-wgmma/sweep.py
out=${OUT:-/tmp/bwd-rs}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 experiments/2026-11-27-bwd-wgmma/sanitize.py \
  --phases bwd_wgmma_ss --dims 64 --params '{"rs": true}' > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
timeout 200 python3 -m pytest --full -q -x tests/test_bulk.py tests/test_backward.py -k "wgmma_ss" \
  > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests.txt"
cfg='{"bwd_wgmma_ss": {}, "bwd_wgmma_ss rs": {"rs": true}}'
for dt in float16 bfloat16; do
  timeout 200 python3 "$sweep" --dtype $dt --out "$out/sweep-$dt.json" --dims 64 --configs "$cfg" > "$out/sweep-$dt.txt" 2>&1
  echo "$dt rc $?"; grep '^{' "$out/sweep-$dt.txt"
done
gzip -f "$out"/*.txt
