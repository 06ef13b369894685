#!/usr/bin/env bash
# The steady loops with carried ring counters (and ws_overlap unrolled by two) on the GPU: the GPU tests of the
# warp-specialised phases, then warp_specialized_tc, pingpong, ws_overlap and SDPA timed in one run per problem
# (CUPTI kernel time) on the issue's problems. About 5-6 minutes on one H200.
#   bash experiments/2026-11-23-hopper-tma/loop_counters.sh OUT
set -u
out=${1:?usage: loop_counters.sh OUT}; mkdir -p "$out"
res="$out/tensor-core-tma-nvidia-h200.jsonl"
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"

echo "## GPU tests"
# every phase of the shared wgmma kernel (its loop changed for all of them), varlen included
NUMBA_ATTN_BACKEND=cuda timeout 240 python3 -m pytest -q -p no:cacheprovider -n 12 -m gpu \
  -k "wgmma or pingpong or ws_overlap or warp_specialized or tma" tests/test_tensor_core.py tests/test_head_dims.py \
  tests/test_hopper.py tests/test_wgmma.py tests/test_varlen.py \
  2>&1 | tee "$out/gpu-tests.txt" | tail -15

echo "## timing"
while read -r args; do
  echo "## $args"
  python3 -m numba_attn.cli run --gpu --phases warp_specialized_tc,pingpong,ws_overlap \
    --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings $args --timing cupti --budget 1 --timeout 180 \
    --results "$res" 2>&1 | tee -a "$out/run.txt"
done <<'PROBLEMS'
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
-B 4 -H 32 -N 2048 -D 64 --dtype float16
-B 1 -H 32 -N 4096 -D 128 --dtype bfloat16
PROBLEMS
