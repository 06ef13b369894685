#!/usr/bin/env bash
# The persistent kernels with their next work item found in a few instructions (scheduler.divmod_small) instead of
# by subtracting the items of a head (or section) one at a time: traced (the gap between items), then timed against
# ws_intra_kv and cuDNN on the short and the long problems of ../2026-11-28-timeline.
#   OUT=dir bash experiments/2026-11-28-schedule/schedule.sh        (about 5 minutes)
set -u
out=${OUT:-/tmp/schedule}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda PYTHONUNBUFFERED=1
python3 experiments/2026-11-28-timeline/trace.py "$out" ws_intra_kv,ws_intra_persistent,ws_persistent 2>&1 | tee "$out/trace.txt"
while read -r args; do
  echo "## $args"
  timeout 100 python3 -m numba_attn.cli run --gpu --phases ws_intra_kv,ws_intra_persistent,ws_persistent \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 35 --results "$out/schedule.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(ws_|torch_sdpa)"
done <<'PROBLEMS'
-B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16
-B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16 --causal
-B 2 -H 32 --kv-heads 8 -N 4096 -D 128 --dtype bfloat16
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
-B 1 -H 32 --kv-heads 8 -N 8192 -D 128 --dtype bfloat16 --causal
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" run.txt trace.txt && rm -f "$out"/*.txt "$out"/*.lock
