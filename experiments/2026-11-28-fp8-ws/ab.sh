#!/usr/bin/env bash
# P's scale folded into the softmax's exponent (no multiply a value) against the tree before it (OLD: a checkout of
# 22ec261's numba_attn), one after the other on one machine, each beside SDPA cuDNN fp16 (B1 H32 N8192 D128); then
# at D64 (B4 H32 N2048) two consumer warpgroups against three (wg3_phases.py) beside cuDNN. CUPTI.
#   OUT=dir OLD=dir bash experiments/2026-11-28-fp8-ws/ab.sh        (about 2.5 minutes)
set -u
out=${OUT:-/tmp/fp8-ab}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 70 python3 -m pytest --full -q -x -p no:cacheprovider tests/test_fp8_forward.py -k "float64_gpu" \
  > "$out/tests.txt" 2>&1; echo "tests rc $?"; tail -1 "$out/tests.txt"
run() {  # label, tree, args...
  local label=$1 tree=$2; shift 2
  echo "## $label"
  (cd "$tree" && timeout 40 python3 -m numba_attn.cli run --gpu --no-ceilings --timing cupti --timeout 25 \
     --results "$out/$label.jsonl" "$@" 2>&1) | tee "$out/$label.txt" | grep -E "^(fp8|torch_sdpa)"
}
D128="-B 1 -H 32 -N 8192 -D 128 --dtype float16"
run old "$OLD" --phases fp8_ws --peers torch_sdpa_cudnn $D128
run new . --phases fp8_ws --peers torch_sdpa_cudnn $D128
PYTHONPATH="experiments/2026-11-28-fp8-ws:${PYTHONPATH:-}" run d64 . --setup wg3_phases --phases fp8_ws,fp8_ws_wg3 \
  --peers torch_sdpa_cudnn -B 4 -H 32 -N 2048 -D 64 --dtype float16
tar -czf "$out/logs.tar.gz" -C "$out" $(cd "$out" && ls *.txt) && rm -f "$out"/*.txt "$out"/*.lock
