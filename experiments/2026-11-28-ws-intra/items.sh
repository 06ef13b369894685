#!/usr/bin/env bash
# The cost of a work item with and without persistent blocks: warp_specialized_tc and ws_persistent (its kernel in
# one block per SM, the next item's K/V tiles loaded during this one's end) beside cuDNN on two problems of 2048
# work items each without a mask: B8 H32/8kv N1024 (8 key tiles an item) and B2 H32/8kv N4096 (32).
#   OUT=dir bash experiments/2026-11-28-ws-intra/items.sh        (about 2 minutes)
set -u
out=${OUT:-/tmp/ws-intra-items}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
for N in "-B 8 -N 1024" "-B 2 -N 4096"; do
  timeout 90 python3 -m numba_attn.cli run --gpu --phases warp_specialized_tc,ws_persistent,ws_intra_kv \
    --peers torch_sdpa_cudnn --no-ceilings $N -H 32 --kv-heads 8 -D 128 --dtype bfloat16 --timing cupti --timeout 40 \
    --results "$out/items.jsonl" 2>&1 | tee -a "$out/run.txt" | grep -E "^(ws_|warp_|torch_sdpa)"
done
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
