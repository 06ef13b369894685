#!/usr/bin/env bash
# ws_overlap with `uniform` on by default, against its parent and SDPA on the issue's problems (fp16 and bf16,
# D128 N4k-16k causal and not, D64), CUPTI kernel time, one run per problem. About 5 minutes on one H200.
#   bash experiments/2026-11-23-hopper-tma/uniform_default.sh OUT
set -u
out=${1:?usage: uniform_default.sh OUT}; mkdir -p "$out"
res="$out/tensor-core-tma-nvidia-h200.jsonl"
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
while read -r args; do
  echo "## $args"
  timeout 75 python3 -m numba_attn.cli run --gpu --phases warp_specialized_tc,ws_overlap \
    --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings $args --timing cupti --budget 1 --timeout 60 \
    --results "$res" 2>&1 | tee -a "$out/run.txt" | grep -E "^\[" 
done <<'PROBLEMS'
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 1 -H 32 -N 4096 -D 128 --dtype bfloat16
-B 1 -H 16 -N 16384 -D 128 --dtype float16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
-B 1 -H 16 -N 16384 -D 128 --dtype float16 --causal
-B 2 -H 16 -N 8192 -D 128 --dtype bfloat16 --causal
-B 4 -H 32 -N 2048 -D 64 --dtype float16
PROBLEMS
