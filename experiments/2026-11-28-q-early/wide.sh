#!/usr/bin/env bash
# ws_tma_q_wide (three consumers on 128-key tiles at D64) on a GPU: its GPU cases under memcheck, timed beside
# ws_tma_q_early's D64 tile, warp_specialized_tc, tma_wgmma and SDPA cuDNN (CUPTI, interleaved); then issue 42's
# nine problems with cuDNN and FlashAttention-4 in one process (check.py).
#   OUT=dir bash experiments/2026-11-28-q-early/wide.sh        (about 6 minutes; FA4 installed for the check)
set -u
out=${OUT:-/tmp/wide}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -p no:cacheprovider \
  tests/test_tensor_core.py -k "ws_tma_q_wide and matches_reference" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
while read -r args; do
  echo "## $args"
  timeout 90 python3 -m numba_attn.cli run --gpu --phases ws_tma_q_early,ws_tma_q_wide,warp_specialized_tc,tma_wgmma \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 40 --results "$out/wide.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(ws_|warp_|tma_|torch_sdpa)"
done <<'PROBLEMS'
-B 4 -H 32 -N 2048 -D 64 --dtype float16
-B 4 -H 32 -N 2048 -D 64 --dtype bfloat16 --causal
-B 16 -H 16 -N 512 -D 64 --dtype float16
-B 2 -H 16 -N 8192 -D 64 --dtype float16 --causal
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt memcheck.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
commit=${NUMBA_ATTN_COMMIT:0:7}; [ -n "$commit" ] || commit=$(git rev-parse --short HEAD)
timeout 330 python3 experiments/2026-11-28-dispatch/check.py \
  --phases ws_tma_q_early,ws_tma_q_wide,ws_tma_q,ws_intra_kv,ws_intra_qs,warp_specialized_tc,tma_wgmma \
  --peers cudnn,fa4 --rounds 3 --budget-s 300 --out "$out/check-h200-fa4-$commit.json" > "$out/check.txt" 2>&1
echo "check rc $?"; grep -aE "fastest|peer" "$out/check.txt" | tail -30
xz -9 "$out/check.txt"
