#!/usr/bin/env bash
# The head-dim grid on a GPU, split over processes (one family or phase each), beside the error tests
# and compute-sanitizer's memcheck and racecheck over every accepted configuration.
# Usage (repository root, numpy < 2.5 on the path): OUT=dir bash experiments/2026-11-22-head-dims/gpu_run.sh
set -u
export NUMBA_ATTN_BACKEND=cuda PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
T="timeout ${LIMIT:-530}"
P="python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_head_dims.py"
S=experiments/2026-11-22-head-dims/sanitize.py
i=0
for k in "tc_mma or tc_pipelined" "tc_tf32" "tc_wgmma" "decode_chunked" "decode_split_k and not fused and not lean" \
         "decode_split_k_fused" "decode_split_k_lean" "decode_mma" "naive or fused_rowwise or smem_kv or q_smem" \
         "segmented_out or one_barrier or warp_specialized" "vectorized or double_buffer" \
         "register_blocked or causal_skip or split_k_prefill"; do
  i=$((i+1)); ($T $P -k "$k" > "$OUT/hd-$i.log" 2>&1; echo "rc=$? [$k]" >> "$OUT/hd-$i.log") &
done
($T python3 -m pytest -q -p no:cacheprovider tests/test_errors.py tests/test_bad_input.py > "$OUT/errors.log" 2>&1
 echo "rc=$?" >> "$OUT/errors.log") &
($T compute-sanitizer --tool memcheck --print-limit 20 python3 $S \
   --phases tc_mma,tc_pipelined,tc_tf32,tc_wgmma,tc_wgmma_overlap,decode_mma > "$OUT/memcheck-tc.log" 2>&1
 echo "rc=$?" >> "$OUT/memcheck-tc.log") &
($T compute-sanitizer --tool memcheck --print-limit 20 python3 $S --head-dims 40,80,96,160,192,256 \
   --phases decode_chunked,decode_split_k,decode_split_k_fused,decode_split_k_lean,smem_kv,vectorized,double_buffer,register_blocked,causal_skip,split_k_prefill \
   > "$OUT/memcheck-other.log" 2>&1; echo "rc=$?" >> "$OUT/memcheck-other.log") &
($T compute-sanitizer --tool racecheck --print-limit 20 python3 $S --head-dims 40,80,160 \
   --phases tc_pipelined,tc_wgmma,decode_mma,decode_split_k_lean,double_buffer,register_blocked > "$OUT/racecheck.log" 2>&1
 echo "rc=$?" >> "$OUT/racecheck.log") &
wait
cat "$OUT"/hd-*.log | grep -E "passed|failed|rc="
for f in errors memcheck-tc memcheck-other racecheck; do
  echo "== $f"; grep -E "passed|failed|SUMMARY|launches|rc=" "$OUT/$f.log" | tail -3
done
