#!/usr/bin/env bash
# tma_wgmma and warp_specialized_tc beside tc_wgmma and SDPA, CUPTI kernel time, on the issue's problems.
#   OUT=dir experiments/2026-11-23-hopper-tma/run.sh
#   PHASES=warp_specialized_tc,pingpong EXTRA="--param pingpong.stages=2" OUT=dir ...   (other phases, parameters)
set -u
out=${OUT:-results/hopper-tma}; mkdir -p "$out"
res="$out/hopper-tma.jsonl"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
phases=${PHASES:-tc_wgmma,tma_wgmma,warp_specialized_tc}
while read -r args; do
  echo "## $args"
  numba-attn run --gpu --phases "$phases" $args --timing cupti --budget ${BUDGET:-1} --results "$res" --timeout 240 ${EXTRA:-}
done <<'PROBLEMS'
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
-B 4 -H 32 -N 2048 -D 64 --dtype float16
-B 1 -H 32 -N 4096 -D 128 --dtype bfloat16
-B 1 -H 16 -N 16384 -D 128 --dtype float16 --causal
PROBLEMS
