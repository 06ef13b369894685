#!/usr/bin/env bash
# paged_split_k with 256 (default), 1024 and 2048 keys at least per split, paged_mma, and the contiguous phases and
# SDPA on the contiguous twins, on the ragged fp16 targets (B8 KV <= 4k and <= 32k, B32 KV <= 4k), CUPTI kernel
# time. About 2-3 minutes on one H200.
#   bash experiments/2026-11-23-paged-8bit/min_keys.sh OUT
set -u
out=${1:?usage: min_keys.sh OUT}; mkdir -p "$out"
export PYTHONPATH="experiments/2026-11-23-paged-8bit${PYTHONPATH:+:$PYTHONPATH}"
NUMBA_ATTN_BACKEND=cuda timeout 300 python3 -m numba_attn.cli bench paged --preset paged-ragged --setup min_keys_phases --timing cupti \
  --phases paged_split_k,paged_split_k_mk1024,paged_split_k_mk2048,paged_mma,decode_split_k_lean,decode_mma \
  --results "$out/paged-ragged-min-keys.jsonl" --plots "" 2>&1 | tee "$out/min-keys.txt" | grep -vi warn | tail -40
