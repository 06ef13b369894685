#!/usr/bin/env bash
# The 16-bit paged rows by 32-bit indices: the tree before (BEFORE, default before_22b965d/: 22b965d's numba_attn/,
#   `git archive 22b965d numba_attn | tar -x -C before_22b965d`) and the checkout, two bench processes each,
#   alternating (paged_split_k, paged_worklist and the twin on the ragged targets and B8 at uniform lengths); first
#   the GPU tests of tests/test_paged.py and its worklist tests under compute-sanitizer memcheck. About 9 minutes.
#   bash experiments/2026-11-26-paged-u32/run.sh OUT
set -u
out=${1:?usage: run.sh OUT}; mkdir -p "$out"
before=${BEFORE:-before_22b965d}
presets=experiments/2026-11-26-worklist-flat  # the preset paged-ragged-uniform
export NUMBA_ATTN_BACKEND=cuda
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
cat "$out/gpu.txt"
timeout 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m pytest -q \
  -p no:cacheprovider tests/test_paged.py -k "gpu or worklist or pages or ragged" > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$?" | tee -a "$out/memcheck.txt"; tail -2 "$out/memcheck.txt"
for run in 1 2; do
  for tree in "$before" .; do
    tag=$([ "$tree" = . ] && echo after || echo before)
    PYTHONPATH="$tree:$presets${PYTHONPATH:+:$PYTHONPATH}" timeout 150 \
      python3 -m numba_attn.cli bench paged --preset paged-ragged-uniform --setup variants --timing cupti \
      --phases paged_split_k,paged_worklist,decode_split_k_lean \
      --results "$out/u32-$tag.jsonl" --plots "" > "$out/bench-$tag-$run.txt" 2>&1
    echo "bench $tag $run rc=$?"
    grep -E "^(paged|decode)" "$out/bench-$tag-$run.txt" | grep -E "µs|ms" | cut -c1-150
  done
done
