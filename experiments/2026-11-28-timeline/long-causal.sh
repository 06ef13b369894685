#!/usr/bin/env bash
# ws_intra_persistent (balanced rounds) against ws_intra and ws_intra_kv on the long causal problems, in one run each
# (it was 1.04x ws_intra_kv at B2 H16 N8192 fp16 causal in ../2026-11-28-ws-intra/persistent.sh).
#   OUT=dir bash experiments/2026-11-28-timeline/long-causal.sh        (about 3 minutes)
set -u
out=${OUT:-/tmp/long-causal}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda PYTHONUNBUFFERED=1
while read -r args; do
  echo "## $args"
  timeout 75 python3 -m numba_attn.cli run --gpu --phases ws_intra,ws_intra_kv,ws_intra_persistent \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 35 --results "$out/long-causal.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(ws_|torch_sdpa)"
done <<'PROBLEMS'
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
-B 1 -H 32 --kv-heads 8 -N 8192 -D 128 --dtype bfloat16 --causal
-B 1 -H 32 -N 16384 -D 128 --dtype bfloat16 --causal
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" run.txt && rm -f "$out"/*.txt "$out"/*.lock
