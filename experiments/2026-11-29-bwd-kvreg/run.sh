#!/usr/bin/env bash
# bwd_wgmma_kvreg (K_j and V_j in registers as Sᵀ's and dPᵀ's A, D64) against its parent bwd_wgmma_ss and SDPA cuDNN:
# memcheck over the odd shapes, the GPU tests, then the sweep of both beside cuDNN in one process (fp16, then bf16;
# B1 H32 N4096 D64, causal and not; CUPTI; gradients checked against float64 first).
#   OUT=dir bash experiments/2026-11-29-bwd-kvreg/run.sh        (about 3 minutes)
set -u
sweep=experiments/2026-11-27-bwd-wgmma/sweep.py
out=${OUT:-/tmp/bwd-kvreg}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 experiments/2026-11-27-bwd-wgmma/sanitize.py \
  --full --phases bwd_wgmma_kvreg --dims 64 > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
timeout 200 python3 -m pytest --full -q -x tests/test_backward.py -k "kvreg" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests.txt"
cfg='{"bwd_wgmma_ss": {}, "bwd_wgmma_kvreg": {}, "bwd_wgmma_kvreg 4 stages": {"stages": 4}}'
for dt in float16 bfloat16; do
  timeout 200 python3 "$sweep" --dtype $dt --dims 64 --out "$out/sweep-$dt.json" --configs "$cfg" \
    > "$out/sweep-$dt.txt" 2>&1
  echo "$dt rc $?"; grep '^{' "$out/sweep-$dt.txt"
done
gzip -f "$out"/*.txt
