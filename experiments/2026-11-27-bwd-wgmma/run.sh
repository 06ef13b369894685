#!/usr/bin/env bash
# The wgmma backward phases on a GPU: their tests and the wgmma operation tests with the CUDA backend, sanitize.py
# under memcheck, sweep.py (tiles, ring depth, beside SDPA cuDNN), then `numba-attn bench backward` for the tensor-core
# backward phases beside SDPA's backward, and one row beside FlexAttention's backward.
# Usage, from the project root with numba-cuda working: OUT=dir bash experiments/2026-11-27-bwd-wgmma/run.sh
set -u
here=experiments/2026-11-27-bwd-wgmma
out=${OUT:-/tmp/bwd-wgmma}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
w=$(( $(nproc) < 16 ? $(nproc) : 16 ))
timeout 200 python3 -m pytest --full -q -p no:cacheprovider -n "$w" tests/test_wgmma.py tests/test_backward.py \
  -k "wgmma" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -3 "$out/tests.txt"
timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 $here/sanitize.py > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
timeout 200 python3 $here/sweep.py --out "$out/sweep.json" > "$out/sweep.txt" 2>&1
echo "sweep rc $?"; grep -v -i warn "$out/sweep.txt" | tail -4
if [ "${BENCH:-1}" = 1 ]; then
  timeout 300 python3 -m numba_attn.cli bench backward --timing cupti --phases bwd_mma,bwd_wgmma,bwd_wgmma_overlap \
    --results "$out/backward.jsonl" --plots "$out" > "$out/bench.txt" 2>&1
  echo "bench rc $?"; grep -v -i warn "$out/bench.txt" | tail -30
  timeout 150 python3 -m numba_attn.cli run --gpu --phases bwd_wgmma_overlap -B 1 -H 32 -N 4096 -D 128 --causal \
    --dtype fp16 --timing cupti --peers torch_sdpa_cudnn_backward,torch_flex_backward --results "$out/flex.jsonl" \
    > "$out/flex.txt" 2>&1
  echo "flex rc $?"; grep -v -i warn "$out/flex.txt" | tail -8
fi
