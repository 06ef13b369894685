#!/usr/bin/env bash
# ws_intra_bulk_o (O staged in shared memory, a bulk copy a row) on a GPU: its GPU tests under memcheck, its GPU
# head-dim test, then timed beside ws_intra_kv and SDPA cuDNN (CUPTI, interleaved) on the 2048-item problems of
# ../2026-11-28-ws-intra and the headline ones, and both traced (trace.py).
#   OUT=dir bash experiments/2026-11-28-timeline/bulk-o.sh        (about 8 minutes)
set -u
out=${OUT:-/tmp/bulk-o}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -p no:cacheprovider \
  tests/test_tensor_core.py tests/test_bulk.py -k "ws_intra_bulk_o or bulk_store" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
timeout 200 python3 -m pytest --full -q -p no:cacheprovider tests/test_head_dims.py -m gpu -k "ws_intra_bulk_o" \
  > "$out/headdims.txt" 2>&1
echo "head dims rc $?"; tail -1 "$out/headdims.txt"; grep -a FAILED "$out/headdims.txt" | head -5
while read -r args; do
  echo "## $args"
  timeout 90 python3 -m numba_attn.cli run --gpu --phases ws_intra_kv,ws_intra_bulk_o --peers torch_sdpa_cudnn \
    --no-ceilings $args --timing cupti --timeout 40 --results "$out/bulk-o.jsonl" 2>&1 | tee -a "$out/run.txt" \
    | grep -E "^(ws_|torch_sdpa)"
done <<'PROBLEMS'
-B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16
-B 2 -H 32 --kv-heads 8 -N 4096 -D 128 --dtype bfloat16
-B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16 --causal
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
PROBLEMS
timeout 120 python3 experiments/2026-11-28-timeline/trace.py "$out" ws_intra_kv,ws_intra_bulk_o 2>&1 | grep -v Warn \
  | cut -c1-400
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt memcheck.txt headdims.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
