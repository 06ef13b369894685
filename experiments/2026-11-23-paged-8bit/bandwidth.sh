#!/usr/bin/env bash
# paged_split_k mma with prefetch=0 (default), 1, 2 on one H200 (~4 minutes, at most 6):
#  1. each 8-bit target (B8 H32 D128 P64; KV 16k, 32k; fp8/head, int8/token) in its own process, beside SDPA
#     on the contiguous fp16 twin, CUPTI kernel time, rows correctness-gated ($1/paged-8bit-bandwidth.jsonl);
#  2. compute-sanitizer memcheck of the prefetch variants on small odd ragged problems (sanitize.py --prefetch);
#  3. tests/test_paged_bandwidth.py on the device (prefetch=1/2 bit-equal to prefetch=0 and within the float64
#     reference's tolerance; the offline SASS test).
# The offline SASS counts (no GPU): python3 experiments/2026-11-23-paged-8bit/inflight_sass.py [--param prefetch=1].
# Each step has its own time limit (4 x 65 + 60 + 40 s: at most 6 minutes).
#   bash experiments/2026-11-23-paged-8bit/bandwidth.sh OUT
set -u
out=${1:?usage: bandwidth.sh OUT}; mkdir -p "$out"
d=experiments/2026-11-23-paged-8bit
export NUMBA_ATTN_BACKEND=cuda
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$out/gpu.txt" 2>&1
for i in 0 1 2 3; do
  timeout 65 python3 $d/bandwidth.py "$out/paged-8bit-bandwidth.jsonl" --index $i \
    2>&1 | tee -a "$out/bandwidth.log" | grep -v Warning; echo "problem $i: exit ${PIPESTATUS[0]}"
done
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 60 "$san" --tool memcheck python3 $d/sanitize.py --phases paged_split_k --prefetch \
  > "$out/sanitize-prefetch.log" 2>&1
echo "memcheck (prefetch): exit $?"; grep -E "launches|ERROR SUMMARY|FAILED" "$out/sanitize-prefetch.log" | tail -5
timeout 40 python3 -m pytest -q -p no:cacheprovider tests/test_paged_bandwidth.py \
  > "$out/tests-bandwidth.log" 2>&1
echo "tests: exit $?"; tail -1 "$out/tests-bandwidth.log"
