#!/usr/bin/env bash
# head_dim 64 (issue 16): more computing warpgroups per SM. The wgmma phases' simulator-shape tests on the GPU under
# compute-sanitizer memcheck (three consumer warpgroups included), then tma_wgmma, tma_uniform, warp_specialized_tc,
# ws3, ws3_uniform (experiments/2026-11-23-hopper-tma/d64_phases.py) and ws_overlap beside SDPA (auto and cuDNN),
# one process per problem, CUPTI kernel time. About 6 minutes on one H200.
#   bash experiments/2026-11-23-hopper-tma/d64.sh OUT
set -u
out=${1:?usage: d64.sh OUT}; mkdir -p "$out"
res="$out/tensor-core-tma-nvidia-h200.jsonl"
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"

echo "## memcheck"
NUMBA_ATTN_BACKEND=cuda timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q \
  -p no:cacheprovider -k "warp_specialized_tc or tma_wgmma" tests/test_tensor_core.py > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$?" | tee -a "$out/memcheck.txt"; tail -4 "$out/memcheck.txt"

echo "## timing"
export PYTHONPATH="experiments/2026-11-23-hopper-tma${PYTHONPATH:+:$PYTHONPATH}"
while read -r args; do
  echo "## $args"
  timeout 100 python3 -m numba_attn.cli run --gpu --setup d64_phases \
    --phases tma_wgmma,tma_uniform,warp_specialized_tc,ws3,ws3_uniform,ws_overlap \
    --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings $args --timing cupti --budget 1 --timeout 60 \
    --results "$res" 2>&1 | tee -a "$out/run.txt"
done <<'PROBLEMS'
-B 4 -H 32 -N 2048 -D 64 --dtype float16
-B 2 -H 16 -N 8192 -D 64 --dtype float16
-B 2 -H 16 -N 8192 -D 64 --dtype float16 --causal
-B 4 -H 32 -N 2048 -D 64 --dtype bfloat16
PROBLEMS
