#!/usr/bin/env bash
# After ws_intra's defaults: its GPU head-dim test (32 ... 224), memcheck of the FP8 overlap loops' flush test and of
# ws_intra at D160, then fp8_overlap (its loop now runs the held P·V at the first unseen tile) beside fp8_ws and SDPA
# cuDNN fp16 at B1 H32 N8192 D128, causal and not, CUPTI.
#   OUT=dir bash experiments/2026-11-28-ws-intra/after.sh        (about 5 minutes)
set -u
out=${OUT:-/tmp/ws-intra-after}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 150 python3 -m pytest --full -q -p no:cacheprovider tests/test_head_dims.py -m gpu -k ws_intra \
  > "$out/headdims.txt" 2>&1
echo "head dims rc $?"; tail -1 "$out/headdims.txt"; grep -a FAILED "$out/headdims.txt" | head -5
timeout 120 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -p no:cacheprovider \
  tests/test_fp8_forward.py -k "flushes" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
while read -r args; do
  echo "## $args"
  timeout 100 python3 -m numba_attn.cli run --gpu --phases fp8_ws,fp8_overlap \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 45 --results "$out/fp8.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(fp8|torch_sdpa)"
done <<'PROBLEMS'
-B 1 -H 32 -N 8192 -D 128 --dtype float16
-B 1 -H 32 -N 8192 -D 128 --dtype float16 --causal
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt headdims.txt memcheck.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
