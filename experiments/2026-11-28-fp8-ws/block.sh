#!/usr/bin/env bash
# fp8_block (a scale a tile, quantized in one pass) beside fp8_overlap and SDPA cuDNN fp16, one process a problem,
# CUPTI; the GPU tests of the FP8 block phase (and fp8_overlap's default) and a memcheck of fp8_block first.
#   OUT=dir bash experiments/2026-11-28-fp8-ws/block.sh        (about 5 minutes)
set -u
out=${OUT:-/tmp/fp8-block}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 100 python3 -m pytest --full -q -p no:cacheprovider tests/test_fp8_forward.py \
  -k "(fp8_block and gpu) or fp8_overlap-default" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests.txt"; grep -a FAILED "$out/tests.txt" | head -5
timeout 70 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -x -p no:cacheprovider \
  tests/test_fp8_forward.py -k "fp8_block and gpu" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
while read -r limit args; do
  echo "## $args"
  timeout "$limit" python3 -m numba_attn.cli run --gpu --phases fp8_overlap,fp8_block \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 40 --results "$out/block.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(fp8|torch_sdpa)"
done <<'PROBLEMS'
100 -B 1 -H 32 -N 8192 -D 128 --dtype float16
50 -B 1 -H 32 -N 8192 -D 128 --dtype float16
55 -B 1 -H 32 -N 8192 -D 128 --dtype bfloat16
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt tests.txt memcheck.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
