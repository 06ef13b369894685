#!/usr/bin/env bash
# ws_intra (each consumer's softmax under its own P·V) on a GPU: its GPU tests and the FP8 overlap loops' flush test,
# a memcheck of ws_intra's tests, then ws_intra and its settings beside warp_specialized_tc and SDPA cuDNN, one
# process a problem (the runner's interleaved rounds), CUPTI kernel time.
#   OUT=dir bash experiments/2026-11-28-ws-intra/run.sh        (about 8 minutes)
set -u
out=${OUT:-/tmp/ws-intra}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
export PYTHONPATH="experiments/2026-11-28-ws-intra${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 150 python3 -m pytest --full -q -p no:cacheprovider tests/test_tensor_core.py tests/test_fp8_forward.py \
  -k "ws_intra or flushes or offline_tma" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests.txt"; grep -a FAILED "$out/tests.txt" | head -5
timeout 120 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -p no:cacheprovider \
  tests/test_tensor_core.py -k "ws_intra and matches" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -aE "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
while read -r phases args; do
  echo "## $args"
  timeout 75 python3 -m numba_attn.cli run --gpu --setup intra_phases --phases "$phases" \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 25 --results "$out/intra.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(ws_|warp_spec|torch_sdpa)"
done <<'PROBLEMS'
warp_specialized_tc,ws_intra,ws_intra_s4,ws_intra_u -B 1 -H 32 -N 4096 -D 128 --dtype float16
warp_specialized_tc,ws_intra,ws_intra_s4,ws_intra_u -B 1 -H 32 -N 4096 -D 128 --dtype bfloat16
warp_specialized_tc,ws_intra,ws_intra_u -B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
warp_specialized_tc,ws_intra,ws_intra_u -B 1 -H 32 --kv-heads 8 -N 8192 -D 128 --dtype bfloat16 --causal
warp_specialized_tc,ws_intra,ws_intra_wg2 -B 4 -H 32 -N 2048 -D 64 --dtype float16
warp_specialized_tc,ws_intra,ws_intra_u -B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bfloat16 --causal
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt tests.txt memcheck.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
