#!/usr/bin/env bash
# paged_split_k mma=True (8-bit codes into mma fragments) on one H200 (~5 minutes):
#  1. each 8-bit target problem in its own process: the default (wide), mma (8 warps; 4 warps × 4 blocks
#     per SM) and SDPA on the contiguous fp16 twin, CUPTI kernel time, rows correctness-gated
#     (appended to $OUT/paged-8bit-mma.jsonl);
#  2. the GPU tests of the paged phases, and the new paths' simulator tests run on the device.
#   OUT=dir bash experiments/2026-11-23-paged-8bit/run_mma.sh
set -u
out=${OUT:-results/paged-mma-check}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda
for i in 0 1 2 3 4; do
  timeout 120 python3 experiments/2026-11-23-paged-8bit/mma.py "$out/paged-8bit-mma.jsonl" --index $i \
    2>&1 | tee -a "$out/mma.log" | grep -v Warning; echo "problem $i: exit ${PIPESTATUS[0]}"
done
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 12 -m gpu tests/test_paged.py > "$out/tests-gpu.log" 2>&1
echo "gpu tests: exit $?"; tail -2 "$out/tests-gpu.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_paged.py tests/test_intrinsics.py \
  -k "mma or cvt or nan or 8bit" > "$out/tests-new.log" 2>&1
echo "new paths' tests on the device: exit $?"; tail -2 "$out/tests-new.log"
