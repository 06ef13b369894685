#!/usr/bin/env bash
# The epilogue's stores through row views made once (numba_attn/phases/tensor_core/epilogue.py): ws_intra_kv and
# ws_intra timed beside SDPA cuDNN (CUPTI, interleaved) on the problems of bulk-o.sh, and ws_intra_kv traced.
#   OUT=dir bash experiments/2026-11-28-timeline/epilogue.sh        (about 5 minutes)
set -u
out=${OUT:-/tmp/epilogue}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
while read -r args; do
  echo "## $args"
  timeout 80 python3 -m numba_attn.cli run --gpu --phases ws_intra_kv,ws_intra --peers torch_sdpa_cudnn \
    --no-ceilings $args --timing cupti --timeout 40 --results "$out/epilogue.jsonl" 2>&1 | tee -a "$out/run.txt" \
    | grep -E "^(ws_|torch_sdpa)"
done <<'PROBLEMS'
-B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16
-B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16 --causal
-B 2 -H 32 --kv-heads 8 -N 4096 -D 128 --dtype bfloat16
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
PROBLEMS
timeout 100 python3 experiments/2026-11-28-timeline/trace.py "$out" ws_intra_kv 2>&1 | grep -v Warn | cut -c1-400
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
