#!/usr/bin/env bash
# Persistent blocks (issue 16, phase ws_persistent): its GPU tests under compute-sanitizer memcheck, then
# ws_persistent and its variants (persistent_phases.py) beside warp_specialized_tc, tma_wgmma and SDPA (auto and
# cuDNN), one process per problem, CUPTI kernel time. Part a: memcheck and head_dim 128 (about 4 minutes on one
# H100); part b: head_dim 64 (about 4 minutes); part c: the ablation wsp_all (one block per work item) at
# B1 H32 N4096 D128 and Nsight Compute on warp_specialized_tc and ws_persistent there (about 3 minutes).
#   bash experiments/2026-11-25-persistent/run.sh OUT a|b|c|d|e|f
# (d: the D128 three again with the SM clock logged, then Nsight Compute at boost clocks on them; e: the parent
# beside cuDNN at B1 H32 N4096 D128 fp16 and bf16, four processes each; f: tma_wgmma and ws3 beside cuDNN at
# B4 H32 N2048 D64 fp16, three processes)
set -u
out=${1:?usage: run.sh OUT a|b|c|d|e|f}; part=${2:?usage: run.sh OUT a|b|c|d|e|f}; mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr 'A-Z ' 'a-z-' | sed 's/nvidia-//; s/-80gb-hbm3//; s/-nvl//')
res="$out/tensor-core-tma-nvidia-${gpu%%-*}.jsonl"
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
export PYTHONPATH="experiments/2026-11-25-persistent${PYTHONPATH:+:$PYTHONPATH}"

if [ "$part" = a ]; then
  echo "## memcheck (simulator-shape tests of ws_persistent with its GPU defaults, then its GPU shapes)"
  NUMBA_ATTN_BACKEND=cuda timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider -k "persistent" tests/test_tensor_core.py > "$out/memcheck.txt" 2>&1
  echo "memcheck rc=$?" | tee -a "$out/memcheck.txt"; tail -4 "$out/memcheck.txt"
  problems='-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 1 -H 32 -N 4096 -D 128 --dtype bfloat16
-B 1 -H 16 -N 16384 -D 128 --dtype float16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal'
  phases=warp_specialized_tc,ws_persistent,wsp_uniform
elif [ "$part" = b ]; then
  problems='-B 4 -H 32 -N 2048 -D 64 --dtype float16
-B 4 -H 32 -N 2048 -D 64 --dtype bfloat16
-B 2 -H 16 -N 8192 -D 64 --dtype float16 --causal'
  phases=tma_wgmma,warp_specialized_tc,ws3,ws_persistent,wsp3
else
  problems=""
fi

[ -n "$problems" ] && while read -r args; do
  echo "## $args"
  timeout 120 python3 -m numba_attn.cli run --gpu --setup persistent_phases --phases "$phases" \
    --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings $args --timing cupti --budget 1 --timeout 60 \
    --results "$res" 2>&1 | tee -a "$out/run-$part.txt"
done <<< "$problems"

if [ "$part" = c ]; then  # the ablation (one block per item) and Nsight Compute on both kernels
  timeout 120 python3 -m numba_attn.cli run --gpu --setup persistent_phases \
    --phases warp_specialized_tc,ws_persistent,wsp_all --peers torch_sdpa_cudnn --no-ceilings \
    -B 1 -H 32 -N 4096 -D 128 --dtype float16 --timing cupti --budget 1 --timeout 60 --results "$res" 2>&1 \
    | tee -a "$out/run-c.txt"
  timeout 200 ncu --launch-skip 1 --launch-count 3 -k regex:warp_specialized_tc --section SpeedOfLight \
    --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
    python3 experiments/2026-11-23-hopper-tma/launch_once.py warp_specialized_tc ws_persistent \
    > "$out/ncu.txt" 2>&1
  echo "ncu rc=$?"
fi

if [ "$part" = d ]; then  # D128: the same three at boost clocks, the SM clock and power logged every 50 ms; then
  # Nsight Compute without its clock control (boost clocks, as the runner sees them) on the three kernels
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 50 > "$out/clocks.csv" &
  smi=$!
  timeout 150 python3 -m numba_attn.cli run --gpu --setup persistent_phases \
    --phases warp_specialized_tc,ws_persistent,wsp_all,warp_specialized_tc,ws_persistent --peers torch_sdpa_cudnn \
    --no-ceilings -B 1 -H 32 -N 4096 -D 128 --dtype float16 --timing cupti --budget 1 --timeout 60 \
    --results "$res" > "$out/run-d.txt" 2>&1
  kill $smi
  timeout 200 ncu --clock-control none --launch-skip 1 --launch-count 5 -k regex:warp_specialized_tc \
    --section SpeedOfLight --section WarpStateStats python3 experiments/2026-11-23-hopper-tma/launch_once.py \
    --setup persistent_phases warp_specialized_tc ws_persistent wsp_all > "$out/ncu-boost.txt" 2>&1
  echo "ncu rc=$?"
fi

if [ "$part" = e ]; then  # warp_specialized_tc beside cuDNN's SDPA at D128, four processes per dtype, the SM clock and
  # power logged (the GPU's clock moves with its power limit: one pair of rows is not enough)
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 > "$out/clocks-e.csv" &
  smi=$!
  for args in "--dtype float16" "--dtype bfloat16"; do
    for i in 1 2 3 4; do
      timeout 100 python3 -m numba_attn.cli run --gpu --phases warp_specialized_tc --peers torch_sdpa_cudnn \
        --no-ceilings -B 1 -H 32 -N 4096 -D 128 $args --timing cupti --budget 1 --timeout 60 --results "$res" 2>&1 \
        | grep -E "^(warp_spec|torch_sdpa)" | tee -a "$out/run-e.txt"
    done
  done
  kill $smi
fi

if [ "$part" = f ]; then  # head_dim 64 fp16: tma_wgmma and ws3 beside cuDNN's SDPA, three processes
  for i in 1 2 3; do
    timeout 90 python3 -m numba_attn.cli run --gpu --setup persistent_phases --phases tma_wgmma,ws3 \
      --peers torch_sdpa_cudnn --no-ceilings -B 4 -H 32 -N 2048 -D 64 --dtype float16 --timing cupti --budget 1 \
      --timeout 60 --results "$res" 2>&1 | grep -E "^(tma_wgmma|ws3|torch_sdpa)" | tee -a "$out/run-f.txt"
  done
fi
