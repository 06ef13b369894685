#!/usr/bin/env bash
# The targets of issues 16 and 18 on an H200 (they are stated for that GPU; the rows since 2026-11-25 are from
# H100s). CUPTI kernel time, the peer in the same process, the SM clock and power logged.
#   bash experiments/2026-11-26-h200-targets/run.sh OUT a|b
# a (prefill, about 7 minutes): warp_specialized_tc and ws_persistent beside cuDNN's SDPA at B1 H32 N4096 D128,
#   three processes per dtype; N16384 and causal N8192 D128, fp16 and bf16, one process each; D64 (tma_wgmma,
#   ws3, wsp3) fp16, bf16 and causal, one process each.
# b (decode, about 6 minutes): experiments/2026-11-25-paged-worklist/run.sh (memcheck of the worklist tests, the
#   ragged paged targets beside the contiguous twins).
# c (D64 settings, about 6 minutes): tma_wgmma, warp_specialized_tc and pingpong at other ring depths, tile
#   widths and warpgroup counts (d64_phases.py) beside SDPA, bf16 B4 H32 N2048 and causal fp16 B2 H16 N8192.
# d (decode, about 2 minutes): the ragged B8 KV <= 4k target's shape with every sequence at the mean length
#   (paged_uniform.py), paged_worklist and paged_split_k beside the contiguous twin: the block table's own cost.
# e (tests, about 6 minutes): warp_specialized_tc's and ws_persistent's GPU tests under compute-sanitizer memcheck,
#   and their every-head-dim GPU test (D64 now three consumers with 128-key tiles by default).
# f (D64, about 4 minutes): warp_specialized_tc at its new D64 default beside tma_wgmma and SDPA: bf16 and fp16
#   B4 H32 N2048 in three processes each, causal fp16 B2 H16 N8192 in two, causal bf16 and B2 H16 N8192 fp16 in one.
# g (tests, about 7 minutes): every GPU test of tests/test_tensor_core.py under compute-sanitizer memcheck, then
#   warp_specialized_tc's every-head-dim GPU test.
# h (D128, about 2 minutes): warp_specialized_tc beside SDPA at B1 H32 N4096 D128 fp16 and bf16, two processes each,
#   and causal B2 H16 N8192 fp16 (the lane index became 32-bit in every wgmma kernel).
# i (decode, about 5 minutes): ahead=True (the next step's page index read during this step) on paged_split_k and
#   paged_worklist (ahead_phases.py) beside the defaults and the twin, at uniform lengths and the ragged targets,
#   two runs; first the paged tests with ahead on the GPU under compute-sanitizer memcheck.
# Any other GPU than an H200 stops the script at once (exit 3) unless ANY_GPU=1.
set -u
out=${1:?usage: run.sh OUT a|b|c|d|e|f|g|h|i}; part=${2:?usage: run.sh OUT a|b|c|d|e|f|g|h|i}; mkdir -p "$out"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
case "$name" in *H200*) ;; *) [ "${ANY_GPU:-0}" = 1 ] || { echo "not an H200: stopping"; exit 3; } ;; esac
gpu=$(echo "$name" | tr 'A-Z ' 'a-z-' | sed 's/nvidia-//; s/-80gb-hbm3//; s/-nvl//')
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 > "$out/clocks-$part.csv" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT

if [ "$part" = a ]; then
  res="$out/tensor-core-tma-nvidia-${gpu%%-*}.jsonl"
  export PYTHONPATH="experiments/2026-11-25-persistent${PYTHONPATH:+:$PYTHONPATH}"
  run() {  # phases, then the problem's arguments
    local phases=$1; shift
    echo "## $*" | tee -a "$out/run-a.txt"
    timeout 120 python3 -m numba_attn.cli run --gpu --setup persistent_phases --phases "$phases" \
      --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings "$@" --timing cupti --budget 1 --timeout 60 \
      --results "$res" 2>&1 | grep -E "^(warp_spec|ws|tma_wgmma|torch_sdpa|wsp)" | tee -a "$out/run-a.txt"
  }
  for i in 1 2 3; do
    for dt in float16 bfloat16; do run warp_specialized_tc,ws_persistent -B 1 -H 32 -N 4096 -D 128 --dtype $dt; done
  done
  for dt in float16 bfloat16; do
    run warp_specialized_tc,ws_persistent -B 1 -H 16 -N 16384 -D 128 --dtype $dt
    run warp_specialized_tc,ws_persistent -B 2 -H 16 -N 8192 -D 128 --dtype $dt --causal
    run tma_wgmma,ws3,wsp3 -B 4 -H 32 -N 2048 -D 64 --dtype $dt
  done
  run tma_wgmma,ws3,wsp3,warp_specialized_tc -B 2 -H 16 -N 8192 -D 64 --dtype float16 --causal
elif [ "$part" = c ]; then
  res="$out/tensor-core-tma-nvidia-${gpu%%-*}.jsonl"
  export PYTHONPATH="experiments/2026-11-26-h200-targets${PYTHONPATH:+:$PYTHONPATH}"
  phases=tma_wgmma,tma_s3,tma_bc128,tma_bc128_s3,tma_wg3,tma_wg3_s3,ws3,ws3_bc128,ws3_s3,pp_bc128,ws_overlap
  for args in "-B 4 -H 32 -N 2048 -D 64 --dtype bfloat16" "-B 2 -H 16 -N 8192 -D 64 --dtype float16 --causal"; do
    echo "## $args" | tee -a "$out/run-c.txt"
    timeout 280 python3 -m numba_attn.cli run --gpu --setup d64_phases --phases $phases \
      --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings $args --timing cupti --budget 1 --timeout 60 \
      --results "$res" 2>&1 | grep -E "^(tma|ws|pp|torch_sdpa)" | tee -a "$out/run-c.txt"
  done
elif [ "$part" = d ]; then
  PYTHONPATH="experiments/2026-11-26-h200-targets${PYTHONPATH:+:$PYTHONPATH}" NUMBA_ATTN_BACKEND=cuda timeout 200 \
    python3 -m numba_attn.cli bench paged --preset paged-uniform --preset paged-ragged --setup paged_uniform \
    --timing cupti --phases paged_split_k,paged_worklist,decode_split_k_lean --results "$out/paged-uniform.jsonl" \
    --plots "" 2>&1 | tee "$out/bench-d.txt" | grep -vi "warn\|cross-check\|^$" | tail -16
elif [ "$part" = i ]; then
  NUMBA_ATTN_BACKEND=cuda timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider tests/test_paged.py -k "step_ahead" > "$out/memcheck-i.txt" 2>&1
  echo "memcheck rc=$?" | tee -a "$out/memcheck-i.txt"; tail -3 "$out/memcheck-i.txt"
  for r in 1 2; do
    PYTHONPATH="experiments/2026-11-26-h200-targets${PYTHONPATH:+:$PYTHONPATH}" NUMBA_ATTN_BACKEND=cuda timeout 200 \
      python3 -m numba_attn.cli bench paged --preset paged-uniform --preset paged-ragged --setup ahead_phases \
      --timing cupti --phases paged_split_k,psk_ahead,paged_worklist,pwl_ahead,decode_split_k_lean \
      --results "$out/paged-ahead.jsonl" --plots "" 2>&1 | tee "$out/bench-i$r.txt" \
      | grep -E "^(paged|psk|pwl|decode)" | grep -E "µs|ms" | tail -16
  done
elif [ "$part" = e ]; then
  NUMBA_ATTN_BACKEND=cuda timeout 230 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_tensor_core.py -k "warp_specialized_tc or ws_persistent" \
    > "$out/memcheck-e.txt" 2>&1
  echo "memcheck rc=$?" | tee -a "$out/memcheck-e.txt"; tail -3 "$out/memcheck-e.txt"
  NUMBA_ATTN_BACKEND=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_head_dims.py \
    -k "warp_specialized_tc or ws_persistent" > "$out/head-dims-e.txt" 2>&1
  echo "head dims rc=$?" | tee -a "$out/head-dims-e.txt"; tail -3 "$out/head-dims-e.txt"
elif [ "$part" = g ]; then
  NUMBA_ATTN_BACKEND=cuda timeout 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_tensor_core.py > "$out/memcheck-g.txt" 2>&1
  echo "memcheck rc=$?" | tee -a "$out/memcheck-g.txt"; tail -3 "$out/memcheck-g.txt"
  NUMBA_ATTN_BACKEND=cuda timeout 250 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_head_dims.py \
    -k "warp_specialized_tc" > "$out/head-dims-g.txt" 2>&1
  echo "head dims rc=$?" | tee -a "$out/head-dims-g.txt"; tail -3 "$out/head-dims-g.txt"
elif [ "$part" = f ] || [ "$part" = h ]; then
  phases=warp_specialized_tc,tma_wgmma
  res="$out/tensor-core-tma-nvidia-${gpu%%-*}.jsonl"
  run() {
    echo "## $*" | tee -a "$out/run-$part.txt"
    timeout 100 python3 -m numba_attn.cli run --gpu --phases "$phases" \
      --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings "$@" --timing cupti --budget 1 --timeout 60 \
      --results "$res" 2>&1 | grep -E "^(warp_spec|tma_wgmma|torch_sdpa)" | tee -a "$out/run-$part.txt"
  }
fi
if [ "$part" = h ]; then
  phases=warp_specialized_tc
  for i in 1 2; do
    for dt in float16 bfloat16; do run -B 1 -H 32 -N 4096 -D 128 --dtype $dt; done
  done
  run -B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
elif [ "$part" = f ]; then
  for i in 1 2 3; do
    for dt in bfloat16 float16; do run -B 4 -H 32 -N 2048 -D 64 --dtype $dt; done
  done
  for i in 1 2; do run -B 2 -H 16 -N 8192 -D 64 --dtype float16 --causal; done
  run -B 2 -H 16 -N 8192 -D 64 --dtype bfloat16 --causal
  run -B 2 -H 16 -N 8192 -D 64 --dtype float16
elif [ "$part" = b ]; then
  bash experiments/2026-11-25-paged-worklist/run.sh "$out"
fi
