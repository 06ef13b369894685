#!/usr/bin/env bash
# paged_worklist's shares in warp steps dealt across items (pwl_ws, variants.py) beside the default, paged_split_k
# and the contiguous twin with SDPA; the three ragged fp16 targets and B8 at uniform lengths. CUPTI kernel time.
#   bash experiments/2026-11-26-warp-steps/run.sh OUT
# First the worklist GPU tests under compute-sanitizer memcheck, then two bench processes (the spread). About 6
# minutes on one H100 or H200. Needs a tree with the option (7a65c37 to 3c2e5ca: parts a, b, c of README.md).
set -u
out=${1:?usage: run.sh OUT}; mkdir -p "$out"
here=experiments/2026-11-26-warp-steps
export NUMBA_ATTN_BACKEND=cuda
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
cat "$out/gpu.txt"
timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m pytest -q \
  -p no:cacheprovider tests/test_paged.py -k "worklist" > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$?" | tee -a "$out/memcheck.txt"; tail -2 "$out/memcheck.txt"
for run in 1 2; do
  PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" timeout 200 \
    python3 -m numba_attn.cli bench paged --preset paged-ragged-uniform --setup variants --timing cupti \
    --phases paged_worklist,pwl_ws,paged_split_k,decode_split_k_lean \
    --results "$out/warp-steps.jsonl" --plots "" > "$out/bench-$run.txt" 2>&1
  echo "bench $run rc=$?"
  grep -E "^(paged|pwl|decode|torch_sdpa )" "$out/bench-$run.txt" | grep -E "µs|ms|reg" | cut -c1-150
done
