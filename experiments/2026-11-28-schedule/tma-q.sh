#!/usr/bin/env bash
# ws_tma_q (the producer brings Q by TMA, a later item's during the last one's end) on a GPU: its GPU cases under
# memcheck, its GPU head-dim test, timed beside its parent ws_intra_persistent, ws_intra_kv and SDPA cuDNN (CUPTI,
# interleaved), and traced; then the long causal fp16 cell's four candidates in one run.
#   OUT=dir bash experiments/2026-11-28-schedule/tma-q.sh        (about 8 minutes)
set -u
out=${OUT:-/tmp/tma-q}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -p no:cacheprovider \
  tests/test_tensor_core.py -k "ws_tma_q and matches_reference" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
timeout 200 python3 -m pytest --full -q -p no:cacheprovider tests/test_head_dims.py -m gpu -k "ws_tma_q" \
  > "$out/headdims.txt" 2>&1
echo "head dims rc $?"; tail -1 "$out/headdims.txt"; grep -a FAILED "$out/headdims.txt" | head -5
while read -r phases args; do
  echo "## $args"
  timeout 100 python3 -m numba_attn.cli run --gpu --phases "$phases" --peers torch_sdpa_cudnn \
    --no-ceilings $args --timing cupti --timeout 40 --results "$out/tma-q.jsonl" 2>&1 | tee -a "$out/run.txt" \
    | grep -E "^(ws_|torch_sdpa)"
done <<'PROBLEMS'
ws_intra_kv,ws_intra_persistent,ws_tma_q -B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16
ws_intra_kv,ws_intra_persistent,ws_tma_q -B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16 --causal
ws_intra_kv,ws_intra_persistent,ws_tma_q -B 1 -H 32 -N 4096 -D 128 --dtype float16
ws_intra,ws_intra_lpt,ws_intra_persistent,ws_tma_q -B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
ws_intra,ws_intra_persistent,ws_tma_q -B 1 -H 32 --kv-heads 8 -N 8192 -D 128 --dtype bfloat16 --causal
PROBLEMS
timeout 120 python3 experiments/2026-11-28-timeline/trace.py "$out" ws_intra_persistent,ws_tma_q 2>&1 \
  | grep -v Warn | cut -c1-420
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt memcheck.txt headdims.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
