#!/usr/bin/env bash
# Non-causal head_dim 128 (issue 16): warp_specialized_tc with 64- and 128-key tiles, uniform warp index off and on
# (d128_phases.py, uniform_phases.py), ws_overlap, beside SDPA (auto and cuDNN), one process per problem, CUPTI
# kernel time; first the two new variants' GPU correctness (the runner's float64 check on every row) under
# compute-sanitizer memcheck on a small problem. About 6 minutes on one H200.
#   bash experiments/2026-11-23-hopper-tma/d128.sh OUT
set -u
out=${1:?usage: d128.sh OUT}; mkdir -p "$out"
res="$out/tensor-core-tma-nvidia-h200.jsonl"
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
export PYTHONPATH="experiments/2026-11-23-hopper-tma${PYTHONPATH:+:$PYTHONPATH}"

echo "## memcheck"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m numba_attn.cli run --gpu \
  --setup d128_phases --phases ws_bc128,ws_bc128_uniform -B 1 -H 2 -N 333 --kv-len 517 -D 128 --dtype float16 \
  --no-ceilings --no-peers --timing events --budget 1 --results "$out/memcheck.jsonl" > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$?" | tee -a "$out/memcheck.txt"; tail -4 "$out/memcheck.txt"

echo "## timing"
while read -r args; do
  echo "## $args"
  timeout 110 python3 -m numba_attn.cli run --gpu --setup d128_phases \
    --phases warp_specialized_tc,ws_uniform,ws_bc128,ws_bc128_uniform,ws_overlap \
    --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings $args --timing cupti --budget 1 --timeout 60 \
    --results "$res" 2>&1 | tee -a "$out/run.txt"
done <<'PROBLEMS'
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 1 -H 32 -N 4096 -D 128 --dtype bfloat16
-B 1 -H 16 -N 16384 -D 128 --dtype float16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
PROBLEMS
