#!/usr/bin/env bash
# Issue 17 on a machine with two GPUs of one model:
#  1. one sweep of 40 configurations (decode_mma, the first 40 of its grid) with 1 worker, with 2 workers (one GPU
#     each) and through Ray with 2 actors: wall times, their ratio (target >= 1.8x), the same best configuration,
#     no lost or duplicated row;
#  2. tc_wgmma and decode_split_k_lean tuned on two shapes no default was chosen for, tuned against default time
#     beside SDPA, all timed by CUPTI kernel time.
# Usage: bash experiments/2026-11-22-tune-scale/run.sh OUT [STAGE...]   (stages: local ray ray-cluster tuned; default local ray tuned),
#        (`local` = `w1 w2`), then python3 experiments/2026-11-22-tune-scale/summarize.py OUT
set -euo pipefail
OUT=${1:-/tmp/tune-scale}
shift || true
STAGES=${*:-local ray tuned}
mkdir -p "$OUT"
export NUMBA_ATTN_TUNING_CACHE="$OUT/cache-scratch.json"  # the sweeps below do not touch the user's cache
na() { python3 -m numba_attn.cli "$@"; }
nvidia-smi -L | tee "$OUT/gpus.txt"
[ "$(nvidia-smi -L | grep -c '^GPU ')" -ge 2 ] || { echo "needs two GPUs" >&2; exit 1; }
echo "${NUMBA_ATTN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}" > "$OUT/commit.txt"

DECODE=(-B 16 -H 32 --kv-heads 8 -N 1 --kv-len 8192 -D 128 --dtype float16)
PREFILL=(-B 8 -H 16 -N 1024 -D 128 --causal --dtype float16)
# the scale sweep: SWEEP_PHASES and SWEEP_BUDGET (configurations per phase) override its size
SWEEP=("${SWEEP_PHASES:-decode_mma}" "${DECODE[@]}" --strategy grid --budget "${SWEEP_BUDGET:-40}" --gpu)

timed() {  # NAME COMMAND...: wall seconds of COMMAND into $OUT/wall.tsv
  local name=$1; shift
  local t0 t1
  t0=$(date +%s.%N)
  "$@" > "$OUT/$name.log" 2>&1
  t1=$(date +%s.%N)
  printf '%s\t%s\n' "$name" "$(python3 -c "print(round($t1 - $t0, 2))")" >> "$OUT/wall.tsv"
  tail -3 "$OUT/$name.log"
}

for stage in $STAGES; do
  case $stage in
  local)  # the same sweep on 1 worker and on 2 workers (each in a results file and a cache of its own)
    timed workers1 na tune "${SWEEP[@]}" --workers 1 --results "$OUT/scale-w1.jsonl" --cache "$OUT/cache-w1.json"
    timed workers2 na tune "${SWEEP[@]}" --workers 2 --results "$OUT/scale-w2.jsonl" --cache "$OUT/cache-w2.json"
    for w in w1 w2; do na tune --show --cache "$OUT/cache-$w.json" > "$OUT/cache-$w.txt" 2>&1 || true; done ;;
  w1|w2)  # one half of `local`, for a host that limits one command's time
    n=${stage#w}
    timed "workers$n" na tune "${SWEEP[@]}" --workers "$n" --results "$OUT/scale-$stage.jsonl" --cache "$OUT/cache-$stage.json"
    na tune --show --cache "$OUT/cache-$stage.json" > "$OUT/cache-$stage.txt" 2>&1 || true ;;
  ray-cluster)  # the same sweep on 2 Ray actors of a Ray cluster started before it (as a cluster outlives a
                # sweep): the cluster's start is timed apart (ray-start), then the sweep connects to it
    rayc() { python3 -m ray.scripts.scripts "$@"; }
    timed ray-start rayc start --head --num-gpus "$(nvidia-smi -L | grep -c '^GPU ')" --disable-usage-stats \
      --include-dashboard false
    timed ray2c na tune "${SWEEP[@]}" --ray auto --workers 2 --results "$OUT/scale-ray2c.jsonl" \
      --cache "$OUT/cache-ray2c.json"
    na tune --show --cache "$OUT/cache-ray2c.json" > "$OUT/cache-ray2c.txt" 2>&1 || true
    rayc stop > "$OUT/ray-stop.log" 2>&1 || true ;;
  ray)    # the same sweep on 2 Ray actors (a local Ray cluster of this machine)
    timed ray2 na tune "${SWEEP[@]}" --ray --workers 2 --results "$OUT/scale-ray2.jsonl" --cache "$OUT/cache-ray2.json"
    na tune --show --cache "$OUT/cache-ray2.json" > "$OUT/cache-ray2.txt" 2>&1 || true
    python3 -c "import ray; ray.shutdown()" >/dev/null 2>&1 || true ;;
  tuned)  # tuned against default beside SDPA, CUPTI kernel time for all (the default is the first candidate)
    na tune tc_wgmma "${PREFILL[@]}" --gpu --workers 2 --timing cupti --results "$OUT/tuned.jsonl" \
      --cache "$OUT/cache.json" > "$OUT/tune-tc_wgmma.log" 2>&1
    na tune decode_split_k_lean "${DECODE[@]}" --gpu --workers 2 --timing cupti --results "$OUT/tuned.jsonl" \
      --cache "$OUT/cache.json" > "$OUT/tune-decode_split_k_lean.log" 2>&1
    na run --phases tc_wgmma "${PREFILL[@]}" --gpu --no-ceilings --timing cupti --results "$OUT/sdpa.jsonl" \
      > "$OUT/sdpa-prefill.log" 2>&1
    na run --phases decode_split_k_lean "${DECODE[@]}" --gpu --no-ceilings --timing cupti \
      --results "$OUT/sdpa.jsonl" > "$OUT/sdpa-decode.log" 2>&1
    na tune --show --cache "$OUT/cache.json" > "$OUT/cache.txt" 2>&1 ;;
  *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
python3 experiments/2026-11-22-tune-scale/summarize.py "$OUT" | tee "$OUT/summary.txt"
