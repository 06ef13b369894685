#!/usr/bin/env bash
# The backward default's rows at N1024 and N4096 (`numba-attn bench backward`, CUPTI, beside SDPA's backends):
# bwd_wgmma_kvreg (D64) and bwd_wgmma_ss (D64 as its parent, D128 as the default), fp16 B1 H32, causal and not.
# N1024 was last measured at bf03580 (0.82-0.88x cuDNN), before rs at D128 and kvreg at D64.
#   OUT=dir bash experiments/2026-11-29-bwd-final/bench.sh        (about 4 minutes)
set -u
out=${OUT:-/tmp/bwd-bench}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 280 python3 -m numba_attn.cli bench backward --timing cupti --phases bwd_wgmma_ss,bwd_wgmma_kvreg \
  --max-total 200 --results "$out/backward.jsonl" > "$out/bench.txt" 2>&1
echo "bench rc $?"; grep -E "bwd_wgmma|cudnn" "$out/bench.txt" | tail -24
gzip -f "$out"/*.txt
