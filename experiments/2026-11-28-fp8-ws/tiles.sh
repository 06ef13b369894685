#!/usr/bin/env bash
# fp8_ws's key tiles of 128 (the default), 192 and 256 beside SDPA cuDNN fp16, one process a problem, CUPTI; the
# GPU tests of the wide tiles and the per-lane warp index, and a memcheck of the wide tiles, first.
#   OUT=dir bash experiments/2026-11-28-fp8-ws/tiles.sh        (about 4 minutes)
set -u
out=${OUT:-/tmp/fp8-tiles}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
export PYTHONPATH="experiments/2026-11-28-fp8-ws${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 100 python3 -m pytest --full -q -x -p no:cacheprovider tests/test_fp8_forward.py \
  -k "bc192 or bc256 or wide or per_lane or (fp8_ws-default and gpu)" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests.txt"
timeout 90 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -x -p no:cacheprovider \
  tests/test_fp8_forward.py -k "(bc192 or bc256) and gpu" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
while read -r phases args; do
  echo "## $args"
  timeout 60 python3 -m numba_attn.cli run --gpu --setup tile_phases --phases "$phases" \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 25 --results "$out/tiles.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(fp8|torch_sdpa)"
done <<'PROBLEMS'
fp8_ws,fp8_ws_bc192,fp8_ws_bc256 -B 1 -H 32 -N 8192 -D 128 --dtype float16
fp8_ws,fp8_ws_bc192,fp8_ws_bc256 -B 1 -H 32 -N 8192 -D 128 --dtype float16 --causal
fp8_ws,fp8_ws_bc192,fp8_ws_bc256 -B 1 -H 32 -N 8192 -D 128 --dtype bfloat16
fp8_ws,fp8_ws_bc256 -B 4 -H 32 -N 2048 -D 64 --dtype float16 --param fp8_ws_bc256.warpgroups=2
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt tests.txt memcheck.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
