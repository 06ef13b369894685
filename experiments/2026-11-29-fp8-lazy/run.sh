#!/usr/bin/env bash
# fp8_lazy (O rescaled only where a row's maximum moved) on a GPU: its FP8 GPU tests and memcheck, then fp8_overlap
# and fp8_lazy beside SDPA cuDNN fp16 (the runner, CUPTI, interleaved rounds), on float16/bfloat16 inputs (quantized
# in the call) and on e4m3 inputs.
#   OUT=dir bash experiments/2026-11-29-fp8-lazy/run.sh        (about 5 minutes)
set -u
out=${OUT:-/tmp/fp8-lazy}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 150 python3 -m pytest --full -q -p no:cacheprovider tests/test_fp8_forward.py -k "lazy" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests.txt"
timeout 120 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -p no:cacheprovider \
  tests/test_fp8_forward.py -k "lazy-default and gpu" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
while read -r args; do
  echo "## $args"
  timeout 150 python3 -m numba_attn.cli run --gpu --phases fp8_overlap,fp8_lazy --peers torch_sdpa_cudnn \
    --no-ceilings --regime interleaved --rounds 3 $args --timing cupti --timeout 60 --results "$out/lazy.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(fp8|torch_sdpa)"
done <<'PROBLEMS'
-B 1 -H 32 -N 8192 -D 128 --dtype float16
-B 1 -H 32 -N 8192 -D 128 --dtype float16 --e4m3-inputs
-B 1 -H 32 -N 8192 -D 128 --dtype float16 --causal
-B 1 -H 32 -N 8192 -D 128 --dtype bfloat16
-B 4 -H 32 -N 2048 -D 64 --dtype float16
PROBLEMS
gzip -f "$out"/*.txt "$out"/*.jsonl
