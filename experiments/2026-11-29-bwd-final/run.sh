#!/usr/bin/env bash
# Issue 41's speed table at one commit: phase=None's backward at D64 (bwd_wgmma_kvreg) and D128 (bwd_wgmma_ss) beside
# SDPA cuDNN, fp16 and bf16, causal and not (B1 H32 N4096; CUPTI kernel and memset time, one process, gradients
# checked against float64 first); memcheck of bwd_wgmma_ss (dQ's finishing kernel, shared with kvreg); then the
# Llama run with its steps interleaved.
#   OUT=dir bash experiments/2026-11-29-bwd-final/run.sh        (about 7 minutes on an H200)
set -u
sweep=experiments/2026-11-27-bwd-wgmma/sweep.py
out=${OUT:-/tmp/bwd-final}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
cfg='{"bwd_wgmma_kvreg": {}, "bwd_wgmma_ss": {}}'
for dt in float16 bfloat16; do
  timeout 240 python3 "$sweep" --dtype $dt --dims 64,128 --out "$out/sweep-$dt.json" --configs "$cfg" \
    > "$out/sweep-$dt.txt" 2>&1
  echo "$dt rc $?"; grep '^{' "$out/sweep-$dt.txt"
done
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 experiments/2026-11-27-bwd-wgmma/sanitize.py \
  --phases bwd_wgmma_ss --dims 64,128 > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
timeout 200 python3 experiments/2026-11-27-train/train.py --steps 500 --seed 1 --out "$out/train-500-seed1.json" \
  --plot "$out/loss-500-seed1.png" > "$out/train.txt" 2>&1
echo "train rc $?"; tail -2 "$out/train.txt"
gzip -f "$out"/*.txt
