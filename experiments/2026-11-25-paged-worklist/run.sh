#!/usr/bin/env bash
# paged_worklist (a ragged batch cut into equal shares of keys across sequences) on the ragged fp16 targets
# (B8 KV <= 4k and <= 32k, B32 KV <= 4k; H32 D128 P64) beside paged_split_k (its default and 3 balanced splits,
# the best setting measured at B8 KV <= 4k), paged_mma, and the contiguous phases and SDPA on the contiguous
# twins (every sequence at the mean: the same bytes); CUPTI kernel time, one process. First the worklist tests on
# the GPU under compute-sanitizer memcheck. About 5 minutes on one H100 or H200.
#   bash experiments/2026-11-25-paged-worklist/run.sh OUT
# and `run.sh OUT counts`: the worker count (4, 12 and 16 blocks per KV head) beside the default and the twin.
set -u
out=${1:?usage: run.sh OUT [counts]}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda
if [ "${2:-}" = counts ]; then
  PYTHONPATH="experiments/2026-11-25-paged-worklist${PYTHONPATH:+:$PYTHONPATH}" timeout 300 \
    python3 -m numba_attn.cli bench paged --preset paged-ragged --setup worker_counts --timing cupti \
    --phases paged_worklist,paged_worklist_w4,paged_worklist_w12,paged_worklist_w16,decode_split_k_lean \
    --results "$out/paged-worklist-counts.jsonl" --plots "" 2>&1 | tee "$out/counts.txt" \
    | grep -vi warn | tail -30
  exit
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > "$out/gpu.csv"
timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m pytest -q \
  -p no:cacheprovider tests/test_paged.py -k "worklist" > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$?" | tee -a "$out/memcheck.txt"
tail -3 "$out/memcheck.txt"
PYTHONPATH="experiments/2026-11-23-paged-ragged-balance${PYTHONPATH:+:$PYTHONPATH}" timeout 330 \
  python3 -m numba_attn.cli bench paged --preset paged-ragged --setup balance_phases --timing cupti \
  --phases paged_split_k,paged_worklist,paged_split_k_bal_s3,paged_mma,decode_split_k_lean,decode_mma \
  --results "$out/paged-worklist.jsonl" --plots "" 2>&1 | tee "$out/bench.txt" | grep -vi warn | tail -40
