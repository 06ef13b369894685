#!/usr/bin/env bash
# ws_intra at its defaults beside warp_specialized_tc and SDPA cuDNN on the other dtype of the D128 problems of issue 42,
# one process a problem (the runner's interleaved rounds), CUPTI kernel time: the rows for results/.
#   OUT=dir bash experiments/2026-11-28-ws-intra/twins.sh        (about 4 minutes)
set -u
out=${OUT:-/tmp/ws-intra-rows}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
while read -r args; do
  echo "## $args"
  timeout 100 python3 -m numba_attn.cli run --gpu --phases warp_specialized_tc,ws_intra \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 45 --results "$out/twins.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(ws_|warp_spec|torch_sdpa)"
done <<'PROBLEMS'
-B 2 -H 16 -N 8192 -D 128 --dtype bfloat16 --causal
-B 1 -H 32 --kv-heads 8 -N 8192 -D 128 --dtype float16 --causal
-B 1 -H 32 -N 16384 -D 128 --dtype bfloat16 --causal
-B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype float16 --causal
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
