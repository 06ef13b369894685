#!/usr/bin/env bash
# ws_intra with 144-key tiles (three stages: 216 KB, the widest that fits at D128 with K and V sharing a stage)
# beside its default (128) and SDPA cuDNN, one process a problem, CUPTI; a memcheck of one odd shape first.
#   OUT=dir bash experiments/2026-11-28-ws-intra/wide.sh        (about 3 minutes)
set -u
out=${OUT:-/tmp/ws-intra-wide}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
export PYTHONPATH="experiments/2026-11-28-ws-intra${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 60 compute-sanitizer --tool memcheck --print-limit 5 python3 -m numba_attn.cli run --gpu --setup intra_phases \
  --phases ws_intra_bc144 -B 1 -H 2 -N 333 --kv-len 517 -D 128 --dtype float16 --causal --no-ceilings \
  --results "$out/memcheck.jsonl" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|ws_intra_bc144 " "$out/memcheck.txt" | tail -2
while read -r args; do
  echo "## $args"
  timeout 90 python3 -m numba_attn.cli run --gpu --setup intra_phases --phases ws_intra,ws_intra_bc144 \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 40 --results "$out/wide.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(ws_|torch_sdpa)"
done <<'PROBLEMS'
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 1 -H 32 -N 4096 -D 128 --dtype bfloat16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt memcheck.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
