#!/usr/bin/env bash
# fp8_overlap (each consumer's softmax under its own P·V) beside fp8_ws (now 192-key tiles at D128) and SDPA cuDNN
# fp16, one process a problem, CUPTI; the GPU tests of the FP8 warp-specialized phases and a memcheck of
# fp8_overlap first.
#   OUT=dir bash experiments/2026-11-28-fp8-ws/overlap.sh        (about 4 minutes)
set -u
out=${OUT:-/tmp/fp8-overlap}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 120 python3 -m pytest --full -q -p no:cacheprovider tests/test_fp8_forward.py \
  -k "overlap or bc192 or bc256 or fp8_ws-default or per_lane" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests.txt"; grep -a FAILED "$out/tests.txt" | head -5
timeout 90 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -x -p no:cacheprovider \
  tests/test_fp8_forward.py -k "overlap and gpu" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
while read -r args; do
  echo "## $args"
  timeout 60 python3 -m numba_attn.cli run --gpu --phases fp8_ws,fp8_overlap \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 25 --results "$out/overlap.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(fp8|torch_sdpa)"
done <<'PROBLEMS'
-B 1 -H 32 -N 8192 -D 128 --dtype float16
-B 1 -H 32 -N 8192 -D 128 --dtype float16 --causal
-B 1 -H 32 -N 8192 -D 128 --dtype bfloat16
-B 4 -H 32 -N 2048 -D 64 --dtype float16
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt tests.txt memcheck.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
