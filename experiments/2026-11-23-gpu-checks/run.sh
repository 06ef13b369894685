#!/usr/bin/env bash
# What the carried ring counters (d6548cc), the `uniform` option (cc33d4b) and paged_split_k's mma path
# (3dcf50d, int8 rework 509049d) still need on a GPU, in parts of under 10 minutes each on one H200 (A-C run at 8ce79fe):
#   A: the GPU tests of every phase of the shared wgmma kernel and of the paged phases, split over
#      processes; compute-sanitizer memcheck over the wgmma phases' accepted head dims and over every paged
#      cache format with `mma` forced on;
#   B: experiments/2026-11-23-hopper-tma/uniform.sh (the option's GPU tests and times against its default);
#   C: experiments/2026-11-23-paged-8bit/run_mma.sh (int8 `mma` against `wide` and SDPA);
#   D: the varlen kernel's ring stage recomputed (7d659fe): the varlen GPU tests, compute-sanitizer over
#      tc_wgmma_varlen, `bench varlen` of tc_wgmma_varlen and its parent (CUPTI); the e4m3 wgmma kind's tests;
#   E: experiments/2026-11-23-paged-8bit/min_keys.sh (the ragged split plan's minimum keys per split).
# Usage (repository root, numpy < 2.5 on the path): OUT=dir bash experiments/2026-11-23-gpu-checks/run.sh A|B|C|D|E
set -u
export NUMBA_ATTN_BACKEND=cuda PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
T="timeout ${LIMIT:-540}"
case ${1:?part A, B, C, D or E} in
A)
  P="python3 -m pytest -q -p no:cacheprovider -m gpu"
  i=0
  for k in "warp_specialized" "pingpong" "ws_overlap" "tma_wgmma" "tc_wgmma and not varlen" "varlen"; do
    i=$((i+1))
    ($T $P -k "$k" tests/test_tensor_core.py tests/test_head_dims.py tests/test_hopper.py tests/test_wgmma.py \
       tests/test_varlen.py > "$OUT/wgmma-$i.log" 2>&1; echo "rc=$? [$k]" >> "$OUT/wgmma-$i.log") &
  done
  ($T $P tests/test_paged.py tests/test_decode.py > "$OUT/paged.log" 2>&1; echo "rc=$?" >> "$OUT/paged.log") &
  ($T compute-sanitizer --tool memcheck --print-limit 20 python3 experiments/2026-11-22-head-dims/sanitize.py \
     --head-dims 40,64,80,96,128 --phases tma_wgmma,warp_specialized_tc,pingpong,ws_overlap,tc_wgmma \
     > "$OUT/memcheck-wgmma.log" 2>&1; echo "rc=$?" >> "$OUT/memcheck-wgmma.log") &
  ($T compute-sanitizer --tool memcheck --print-limit 20 python3 experiments/2026-11-23-paged-8bit/sanitize.py \
     --phases paged_split_k > "$OUT/memcheck-paged.log" 2>&1; echo "rc=$?" >> "$OUT/memcheck-paged.log") &
  wait
  for f in "$OUT"/wgmma-*.log "$OUT"/paged.log; do grep -E "passed|failed|rc=" "$f" | tail -2; done
  for f in memcheck-wgmma memcheck-paged; do
    echo "== $f"; grep -E "SUMMARY|launches|rc=" "$OUT/$f.log" | tail -3
  done ;;
B) bash experiments/2026-11-23-hopper-tma/uniform.sh "$OUT" ;;
C) OUT="$OUT" bash experiments/2026-11-23-paged-8bit/run_mma.sh ;;
D)
  # (run at 1fc0730 with `-k varlen` over test_tensor_core.py and test_wgmma.py, which selected no test; the
  #  varlen tests live in test_varlen.py, which the memcheck below ran: 15 passed)
  timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_varlen.py \
    > "$OUT/varlen-tests.log" 2>&1; echo "varlen GPU tests: exit $?"
  tail -2 "$OUT/varlen-tests.log"
  # the e4m3 wgmma kind (983e58e) on the real instruction: its A-fragment layout is an assumption until this passes
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_wgmma.py -k e4m3 > "$OUT/e4m3-tests.log" 2>&1
  echo "e4m3 wgmma tests: exit $?"; tail -2 "$OUT/e4m3-tests.log"
  # (sanitize.py runs contiguous problems only: the varlen tests run on the GPU under memcheck instead)
  timeout 200 compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
    tests/test_varlen.py > "$OUT/memcheck-varlen.log" 2>&1; echo "memcheck: exit $?"
  grep -E "SUMMARY|passed|failed" "$OUT/memcheck-varlen.log" | tail -2
  # (200 s covered two of the preset's problems at 1fc0730: the limit is now 330 s)
  timeout 330 python3 -m numba_attn.cli bench varlen --timing cupti --phases tc_wgmma_varlen,tc_wgmma \
    --max-total 300 --plots "" --results "$OUT/varlen.jsonl" > "$OUT/varlen-bench.log" 2>&1; echo "bench: exit $?"
  grep -E "^\[" "$OUT/varlen-bench.log" | tail -20 ;;
E) bash experiments/2026-11-23-paged-8bit/min_keys.sh "$OUT" ;;
*) echo "part A, B, C, D or E" >&2; exit 2 ;;
esac
