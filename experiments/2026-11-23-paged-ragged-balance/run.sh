#!/usr/bin/env bash
# paged_split_k with balanced splits (balance=True) against its default, at the ragged plan's split count and at
# fixed counts 3/5/6/8, beside paged_mma and the contiguous phases and SDPA on the contiguous twins, on the ragged
# fp16 targets (B8 KV <= 4k and <= 32k, B32 KV <= 4k); CUPTI kernel time. First the balance tests on the GPU under
# compute-sanitizer memcheck. About 6 minutes on one H200.
#   bash experiments/2026-11-23-paged-ragged-balance/run.sh OUT
set -u
out=${1:?usage: run.sh OUT}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider \
  tests/test_paged.py -k "balance" > "$out/memcheck.txt" 2>&1; echo "memcheck rc=$?" | tee -a "$out/memcheck.txt"
tail -5 "$out/memcheck.txt"
V=paged_split_k_bal,paged_split_k_bal_s3,paged_split_k_s3,paged_split_k_bal_s5,paged_split_k_s5
V=$V,paged_split_k_bal_s6,paged_split_k_s6,paged_split_k_bal_s8,paged_split_k_s8
PYTHONPATH="experiments/2026-11-23-paged-ragged-balance${PYTHONPATH:+:$PYTHONPATH}" timeout 400 \
  python3 -m numba_attn.cli bench paged --preset paged-ragged --setup balance_phases --timing cupti \
  --phases paged_split_k,$V,paged_mma,decode_split_k_lean,decode_mma \
  --results "$out/paged-ragged-balance.jsonl" --plots "" 2>&1 | tee "$out/balance.txt" | grep -vi warn | tail -60
