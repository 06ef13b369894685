#!/usr/bin/env bash
# attention_fp8 (e4m3 inputs) on a GPU: its GPU tests under memcheck, then time_fp8.py (CUPTI, one process, beside
# the quantizing call, the fastest fp16 phase and SDPA cuDNN fp16).
#   OUT=dir bash experiments/2026-11-28-fp8-inputs/run.sh        (about 6 minutes)
set -u
out=${OUT:-/tmp/fp8-inputs}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest -q -p no:cacheprovider \
  tests/test_fp8_inputs.py -k "gpu" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
timeout 300 python3 experiments/2026-11-28-fp8-inputs/time_fp8.py --out "$out/fp8-inputs.json" 2>&1 \
  | tee "$out/time.txt" | grep -v Warn
# the same problems through the runner (rows checked against the exact reference of the codes; SDPA cuDNN on their
# decoded fp16 values, interleaved), beside the quantizing call on fp16 inputs
for args in "-B 1 -H 32 -N 8192 -D 128 --dtype float16" "-B 1 -H 32 -N 8192 -D 128 --dtype float16 --causal"; do
  timeout 150 python3 -m numba_attn.cli run --gpu --phases fp8_overlap,fp8_ws --e4m3-inputs $args --timing cupti \
    --peers torch_sdpa_cudnn --no-ceilings --timeout 60 --results "$out/runner.jsonl" 2>&1 | grep -E "^(fp8|torch)"
  timeout 150 python3 -m numba_attn.cli run --gpu --phases fp8_overlap $args --timing cupti --peers torch_sdpa_cudnn \
    --no-ceilings --timeout 60 --results "$out/runner.jsonl" 2>&1 | grep -E "^(fp8|torch)"
done
gzip -f "$out"/*.txt "$out"/*.jsonl
