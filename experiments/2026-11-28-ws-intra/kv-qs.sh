#!/usr/bin/env bash
# ws_intra_kv (K and V on barriers of their own, two stages) and ws_intra_qs (and Q in shared memory: 176-key tiles
# at D128, two consumers at D256) on a GPU: their GPU tests under memcheck first (the simulator cannot see a
# release too early or a missing proxy fence), then each beside ws_intra (tma_wgmma at D256) and SDPA cuDNN,
# one process a problem, CUPTI.
#   OUT=dir bash experiments/2026-11-28-ws-intra/kv-qs.sh        (about 7 minutes)
set -u
out=${OUT:-/tmp/ws-intra-kv-qs}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -p no:cacheprovider \
  tests/test_tensor_core.py -k "(ws_intra_kv or ws_intra_qs) and matches" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
timeout 150 python3 -m pytest --full -q -p no:cacheprovider tests/test_head_dims.py -m gpu -k "ws_intra_kv or ws_intra_qs" \
  > "$out/headdims.txt" 2>&1
echo "head dims rc $?"; tail -1 "$out/headdims.txt"; grep -a FAILED "$out/headdims.txt" | head -5
while read -r phases args; do
  echo "## $args"
  timeout 90 python3 -m numba_attn.cli run --gpu --phases "$phases" --peers torch_sdpa_cudnn --no-ceilings $args \
    --timing cupti --timeout 40 --results "$out/kvqs.jsonl" 2>&1 | tee -a "$out/run.txt" | grep -E "^(ws_|tma_|torch_sdpa)"
done <<'PROBLEMS'
ws_intra,ws_intra_kv,ws_intra_qs -B 1 -H 32 -N 4096 -D 128 --dtype float16
ws_intra,ws_intra_kv,ws_intra_qs -B 1 -H 32 -N 4096 -D 128 --dtype bfloat16
ws_intra,ws_intra_kv,ws_intra_qs -B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
tma_wgmma,ws_intra_qs -B 1 -H 16 -N 4096 -D 256 --dtype float16
ws_intra,ws_intra_qs -B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16 --causal
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt memcheck.txt headdims.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
