#!/usr/bin/env bash
# lazy_rescale on the GPU: its GPU tests (float64 reference, a max that jumps and one that does not), then
# warp_specialized_tc with it off and on (ws_lazy: lazy_phases.py) beside SDPA cuDNN, one run per problem, CUPTI.
#   OUT=dir bash experiments/2026-11-28-lazy-rescale/run.sh
set -u
out=${OUT:-/tmp/lazy-rescale}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider -k "lazy_rescale" tests/test_tensor_core.py > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests.txt"
export PYTHONPATH="experiments/2026-11-28-lazy-rescale${PYTHONPATH:+:$PYTHONPATH}"
while read -r args; do
  echo "## $args"
  timeout 90 python3 -m numba_attn.cli run --gpu --setup lazy_phases --phases warp_specialized_tc,ws_lazy \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 60 \
    --results "$out/lazy.jsonl" 2>&1 | tee -a "$out/run.txt" | grep -E "^(warp_specialized_tc|ws_lazy|torch_sdpa)"
done <<'PROBLEMS'
-B 1 -H 32 -N 4096 -D 128 --dtype float16
-B 1 -H 32 -N 4096 -D 128 --dtype bfloat16
-B 2 -H 16 -N 8192 -D 128 --dtype float16 --causal
-B 4 -H 32 -N 2048 -D 64 --dtype float16
PROBLEMS
gzip -f "$out"/*.txt
