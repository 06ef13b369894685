#!/usr/bin/env bash
# The backward benchmark on a GPU (`numba-attn bench backward`, CUPTI kernel time) and the backward runner's tests
# with the CUDA backend. Usage, from the project root with numba-cuda working:
#   OUT=dir bash experiments/2026-11-27-backward-bench/run.sh
set -u
out=${OUT:-/tmp/backward-bench}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_backward.py tests/test_backward_reference.py \
  -k "peer_row or unwritten or commands_list or torch_float64" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -2 "$out/tests.txt"
timeout 440 python3 -m numba_attn.cli bench backward --timing cupti --results "$out/backward.jsonl" --plots "$out" \
  > "$out/bench.txt" 2>&1
echo "bench rc $?"; grep -v -i warn "$out/bench.txt" | tail -45
