#!/usr/bin/env bash
# ws_tma_q_early (Q released after the item's last S) on a GPU: its GPU cases under memcheck, timed beside ws_tma_q,
# ws_tma_q_rows and SDPA cuDNN (CUPTI, interleaved), the three traced at B8 N1024.
#   OUT=dir bash experiments/2026-11-28-q-early/run.sh        (about 5 minutes)
set -u
out=${OUT:-/tmp/q-early}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 120 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -p no:cacheprovider \
  tests/test_tensor_core.py -k "ws_tma_q_early and matches_reference" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
while read -r args; do
  echo "## $args"
  timeout 90 python3 -m numba_attn.cli run --gpu --phases ws_tma_q,ws_tma_q_rows,ws_tma_q_early \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 40 --results "$out/q-early.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(ws_|torch_sdpa)"
done <<'PROBLEMS'
-B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16
-B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16 --causal
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
-B 1 -H 32 -N 16384 -D 128 --dtype float16 --causal
PROBLEMS
timeout 70 python3 experiments/2026-11-28-timeline/trace.py "$out" ws_tma_q,ws_tma_q_rows,ws_tma_q_early 2>&1 \
  | grep -v Warn | head -3 | cut -c1-420
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt memcheck.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
