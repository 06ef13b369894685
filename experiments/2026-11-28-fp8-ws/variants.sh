#!/usr/bin/env bash
# fp8_ws against its two untimed variants, beside SDPA cuDNN fp16, one process a problem, CUPTI: the warp index known
# warp-uniform (fp8_ws_uniform, uniform_phases.py) and the consumers taking turns (fp8_pingpong); their GPU tests
# and a memcheck of fp8_pingpong first.
#   OUT=dir bash experiments/2026-11-28-fp8-ws/variants.sh        (about 4 minutes)
set -u
out=${OUT:-/tmp/fp8-variants}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
export PYTHONPATH="experiments/2026-11-28-fp8-ws${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 90 python3 -m pytest --full -q -x -p no:cacheprovider tests/test_fp8_forward.py -k "uniform or pingpong or D32 or D16" \
  > "$out/tests.txt" 2>&1; echo "tests rc $?"; tail -1 "$out/tests.txt"
timeout 90 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest --full -q -x -p no:cacheprovider \
  tests/test_fp8_forward.py -k "pingpong and gpu" > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY|passed|failed" "$out/memcheck.txt" | tail -2
while read -r args; do
  echo "## $args"
  timeout 50 python3 -m numba_attn.cli run --gpu --setup uniform_phases --phases fp8_ws,fp8_ws_uniform,fp8_pingpong \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 25 --results "$out/uniform.jsonl" 2>&1 \
    | tee -a "$out/run.txt" | grep -E "^(fp8|torch_sdpa)"
done <<'PROBLEMS'
-B 1 -H 32 -N 8192 -D 128 --dtype float16
-B 1 -H 32 -N 8192 -D 128 --dtype float16 --causal
-B 4 -H 32 -N 2048 -D 64 --dtype float16
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt tests.txt memcheck.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
