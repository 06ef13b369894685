#!/usr/bin/env bash
# ws_intra_lpt (the causal query blocks started longest first) on a GPU: its GPU tests under memcheck, then beside
# ws_intra_kv and SDPA cuDNN on the short and long causal problems; and, for the short sequences' cost a work item,
# ws_intra_kv and cuDNN on two problems of the same FLOPs without a mask: B8 N1024 (2048 items of 8 key tiles) and
# B2 N4096 (512 items of 32 tiles). One process a problem, CUPTI.
#   OUT=dir bash experiments/2026-11-28-ws-intra/lpt.sh        (about 6 minutes)
set -u
out=${OUT:-/tmp/ws-intra-lpt}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -p no:cacheprovider \
  tests/test_tensor_core.py -k "ws_intra_lpt and matches" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
while read -r phases args; do
  echo "## $phases $args"
  timeout 90 python3 -m numba_attn.cli run --gpu --phases "$phases" --peers torch_sdpa_cudnn --no-ceilings $args \
    --timing cupti --timeout 40 --results "$out/lpt.jsonl" 2>&1 | tee -a "$out/run.txt" | grep -E "^(ws_|tma_|torch_sdpa)"
done <<'PROBLEMS'
ws_intra_kv,ws_intra_lpt -B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16 --causal
ws_intra_kv,ws_intra_lpt -B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype float16 --causal
ws_intra_kv,ws_intra_lpt -B 4 -H 32 --kv-heads 8 -N 2048 -D 128 --dtype bfloat16 --causal
ws_intra_kv,ws_intra_lpt -B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
ws_intra_kv -B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16
ws_intra_kv -B 2 -H 32 --kv-heads 8 -N 4096 -D 128 --dtype bfloat16
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt memcheck.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
