#!/usr/bin/env bash
# Issue 17 on a machine with two GPUs of one model (not run yet):
#  1. one sweep of >= 40 configurations (decode_split_k_lean and decode_mma, 40 each, grid order) with 1 worker,
#     with 2 workers (one GPU each) and through Ray with 2 actors: wall times, their ratio (target >= 1.8x),
#     the same best configuration, no lost or duplicated row;
#  2. tc_wgmma and decode_split_k_lean tuned on two shapes no default was chosen for, tuned against default time
#     beside SDPA.
# Usage: bash experiments/2026-11-22-tune-scale/run.sh [OUT]   (default OUT: /tmp/tune-scale); then
#        python3 experiments/2026-11-22-tune-scale/summarize.py OUT
set -euo pipefail
OUT=${1:-/tmp/tune-scale}
mkdir -p "$OUT"
export NUMBA_ATTN_TUNING_CACHE="$OUT/cache-scratch.json"  # the sweeps below do not touch the user's cache
nvidia-smi -L | tee "$OUT/gpus.txt"
[ "$(nvidia-smi -L | grep -c '^GPU ')" -ge 2 ] || { echo "needs two GPUs" >&2; exit 1; }
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true

DECODE=(-B 16 -H 32 --kv-heads 8 -N 1 --kv-len 8192 -D 128 --dtype float16)
PREFILL=(-B 8 -H 16 -N 1024 -D 128 --causal --dtype float16)
SWEEP=(decode_split_k_lean,decode_mma "${DECODE[@]}" --strategy grid --budget 40 --gpu)

timed() {  # NAME COMMAND...: wall seconds of COMMAND into $OUT/wall.tsv
  local name=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  "$@" 2>&1 | tee "$OUT/$name.log"
  t1=$(date +%s.%N)
  printf '%s\t%s\n' "$name" "$(python3 -c "print(round($t1 - $t0, 2))")" >> "$OUT/wall.tsv"
}

: > "$OUT/wall.tsv"
# 1. the same sweep on 1 worker, 2 workers, 2 Ray actors (each in a results file and a cache of its own)
timed workers1 numba-attn tune "${SWEEP[@]}" --workers 1 --results "$OUT/scale-w1.jsonl" --cache "$OUT/cache-w1.json"
timed workers2 numba-attn tune "${SWEEP[@]}" --workers 2 --results "$OUT/scale-w2.jsonl" --cache "$OUT/cache-w2.json"
if python3 -c "import ray" 2>/dev/null; then
  timed ray2 numba-attn tune "${SWEEP[@]}" --ray --workers 2 --results "$OUT/scale-ray2.jsonl" --cache "$OUT/cache-ray2.json"
  ray stop >/dev/null 2>&1 || true
else
  echo "ray is not installed (pip install -e \".[ray]\"): the Ray run is left out" | tee "$OUT/ray2.log"
fi

# 2. tuned vs default beside SDPA on two shapes no default was chosen for (the default is the first candidate)
numba-attn tune tc_wgmma "${PREFILL[@]}" --gpu --workers 2 --results "$OUT/tuned.jsonl" --cache "$OUT/cache.json" \
  2>&1 | tee "$OUT/tune-tc_wgmma.log"
numba-attn tune decode_split_k_lean "${DECODE[@]}" --gpu --workers 2 --results "$OUT/tuned.jsonl" \
  --cache "$OUT/cache.json" 2>&1 | tee "$OUT/tune-decode_split_k_lean.log"
numba-attn run --phases tc_wgmma "${PREFILL[@]}" --gpu --no-ceilings --results "$OUT/sdpa.jsonl" 2>&1 | tee "$OUT/sdpa-prefill.log"
numba-attn run --phases decode_split_k_lean "${DECODE[@]}" --gpu --no-ceilings --results "$OUT/sdpa.jsonl" \
  2>&1 | tee "$OUT/sdpa-decode.log"
numba-attn tune --show --cache "$OUT/cache.json" | tee "$OUT/cache.txt"
python3 experiments/2026-11-22-tune-scale/summarize.py "$OUT" | tee "$OUT/summary.txt"
