#!/usr/bin/env bash
# paged_worklist's flat work list (one list over every (sequence, KV head), as many blocks as SM slots) against a
# list per KV head (the default; pwl_flat the flat list; W blocks per KV head: 256 of 264 slots at H32 on 132 SMs), paged_split_k and the
# contiguous twin with SDPA; the three ragged fp16 targets and B8 at uniform lengths. CUPTI kernel time.
#   bash experiments/2026-11-26-worklist-flat/run.sh OUT
# First the worklist tests on the GPU under compute-sanitizer memcheck, then two bench processes (the spread).
# About 7 minutes on one H100 or H200.
# b: the tree before "whole items write the output" (BEFORE, default before_8c7b088/: 8c7b088's numba_attn/,
#   `git archive 8c7b088 numba_attn | tar -x -C before_8c7b088`) and the checkout, two bench processes each,
#   alternating; memcheck of the worklist tests first. About 7 minutes.
# c: 4 warps at 4 blocks per SM and 2 warps at 8 (pwl_w4b4, pwl_w2b8) beside the default (8 warps, 2 blocks per SM),
#   paged_split_k and the twin, two bench processes; memcheck of the worklist tests first. About 6 minutes.
# d: the next item's first 1 or 2 warp steps prefetched to L2 (pwl_nx1, pwl_nx2) beside the default, paged_split_k
#   and the twin, two bench processes; memcheck of the worklist tests first. About 6 minutes.
set -u
out=${1:?usage: run.sh OUT [b|c|d]}; mkdir -p "$out"
here=experiments/2026-11-26-worklist-flat
export NUMBA_ATTN_BACKEND=cuda
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
cat "$out/gpu.txt"
timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m pytest -q \
  -p no:cacheprovider tests/test_paged.py -k "worklist" > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$?" | tee -a "$out/memcheck.txt"; tail -2 "$out/memcheck.txt"
if [ "${2:-}" = c ] || [ "${2:-}" = d ]; then
  part=$2
  phases=$([ "$part" = c ] && echo paged_worklist,pwl_w4b4,pwl_w2b8 || echo paged_worklist,pwl_nx1,pwl_nx2)
  for run in 1 2; do
    PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" timeout 200 \
      python3 -m numba_attn.cli bench paged --preset paged-ragged-uniform --setup variants --timing cupti \
      --phases $phases,paged_split_k,decode_split_k_lean \
      --results "$out/worklist-$part.jsonl" --plots "" > "$out/bench-$part-$run.txt" 2>&1
    echo "bench $part $run rc=$?"
    grep -E "^(paged|pwl|decode|torch_sdpa )" "$out/bench-$part-$run.txt" | grep -E "µs|ms" | cut -c1-150
  done
  exit 0
fi
if [ "${2:-}" = b ]; then
  before=${BEFORE:-before_8c7b088}
  for run in 1 2; do
    for tree in "$before" .; do
      tag=$([ "$tree" = . ] && echo after || echo before)
      PYTHONPATH="$tree:$here${PYTHONPATH:+:$PYTHONPATH}" timeout 150 \
        python3 -m numba_attn.cli bench paged --preset paged-ragged-uniform --setup variants --timing cupti \
        --phases paged_worklist,paged_split_k,decode_split_k_lean \
        --results "$out/worklist-whole-$tag.jsonl" --plots "" > "$out/bench-b-$tag-$run.txt" 2>&1
      echo "bench $tag $run rc=$?"
      grep -E "^(paged|decode)" "$out/bench-b-$tag-$run.txt" | grep -E "µs|ms" | cut -c1-110
    done
  done
  exit 0
fi
for run in 1 2; do
  PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" timeout 200 \
    python3 -m numba_attn.cli bench paged --preset paged-ragged-uniform --setup variants --timing cupti \
    --phases paged_worklist,pwl_flat,paged_split_k,decode_split_k_lean \
    --results "$out/worklist-flat.jsonl" --plots "" > "$out/bench-$run.txt" 2>&1
  echo "bench $run rc=$?"
  grep -E "^(paged|pwl|decode|torch_sdpa )" "$out/bench-$run.txt" | grep -E "µs|ms" | cut -c1-150
done
