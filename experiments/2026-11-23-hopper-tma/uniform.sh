#!/usr/bin/env bash
# The uniform option (warp index broadcast from lane 0: wgmma descriptors and ring counters in the uniform
# datapath) on the GPU: the GPU tests of warp_specialized_tc and ws_overlap with it on, then both phases with
# it off and on (ws_uniform, ws_overlap_uniform: experiments/2026-11-23-hopper-tma/uniform_phases.py) and
# SDPA timed in one run per problem (CUPTI kernel time). About 5-6 minutes on one H200.
#   bash experiments/2026-11-23-hopper-tma/uniform.sh OUT
set -u
out=${1:?usage: uniform.sh OUT}; mkdir -p "$out"
res="$out/tensor-core-tma-nvidia-h200.jsonl"
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"

echo "## GPU tests"
# the option's cases (float64 reference; on realistic shapes also no local memory, HGMMA and UTMALDG in the SASS)
NUMBA_ATTN_BACKEND=cuda timeout 100 python3 -m pytest -q -p no:cacheprovider -n 8 \
  -k "uniform and not offline" tests/test_tensor_core.py 2>&1 | tee "$out/gpu-tests.txt" | tail -8

echo "## timing"
export PYTHONPATH="experiments/2026-11-23-hopper-tma${PYTHONPATH:+:$PYTHONPATH}"
while read -r args; do
  echo "## $args"
  timeout 80 python3 -m numba_attn.cli run --gpu --setup uniform_phases \
    --phases warp_specialized_tc,ws_uniform,ws_overlap,ws_overlap_uniform \
    --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings $args --timing cupti --budget 1 --timeout 60 \
    --results "$res" 2>&1 | tee -a "$out/run.txt"
done <<'PROBLEMS'
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
-B 4 -H 32 -N 2048 -D 64 --dtype float16
PROBLEMS
