#!/usr/bin/env bash
# ws_intra_persistent (ws_intra_kv in persistent blocks, items in snaked rounds) on a GPU: its GPU tests under
# memcheck, ws_intra_kv's GPU head-dim test (the Hopper rule's D128 choice without a mask; cut by its timeout in
# kv-qs.sh), then beside ws_intra_kv, ws_persistent and SDPA cuDNN on the two problems of 2048 work items of
# items.sh (a work item's cost, with and without persistence) and on the short and long causal problems.
#   OUT=dir bash experiments/2026-11-28-ws-intra/persistent.sh        (about 9 minutes)
set -u
out=${OUT:-/tmp/ws-intra-persistent}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -p no:cacheprovider \
  tests/test_tensor_core.py -k "ws_intra_persistent and matches" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
timeout 240 python3 -m pytest --full -q -p no:cacheprovider tests/test_head_dims.py -m gpu -k "ws_intra_kv" \
  > "$out/headdims.txt" 2>&1
echo "head dims rc $?"; tail -1 "$out/headdims.txt"; grep -a FAILED "$out/headdims.txt" | head -5
while read -r phases args; do
  echo "## $phases $args"
  timeout 90 python3 -m numba_attn.cli run --gpu --phases "$phases" --peers torch_sdpa_cudnn --no-ceilings $args \
    --timing cupti --timeout 40 --results "$out/persistent.jsonl" 2>&1 | tee -a "$out/run.txt" \
    | grep -E "^(ws_|torch_sdpa)"
done <<'PROBLEMS'
ws_intra_kv,ws_intra_persistent,ws_persistent -B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16
ws_intra_kv,ws_intra_persistent,ws_persistent -B 2 -H 32 --kv-heads 8 -N 4096 -D 128 --dtype bfloat16
ws_intra_kv,ws_intra_persistent -B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16 --causal
ws_intra_kv,ws_intra_persistent -B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt memcheck.txt headdims.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
