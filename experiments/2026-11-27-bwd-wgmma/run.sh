#!/usr/bin/env bash
# bwd_wgmma on a GPU: its tests and the wgmma operation tests with the CUDA backend, sanitize.py under memcheck,
# then the backward times beside bwd_mma and SDPA's backward (experiments/2026-11-27-bwd-atomic-variants/bwd_time.py).
# Usage, from the project root with numba-cuda working: OUT=dir bash experiments/2026-11-27-bwd-wgmma/run.sh
set -u
here=experiments/2026-11-27-bwd-wgmma
out=${OUT:-/tmp/bwd-wgmma}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
w=$(( $(nproc) < 16 ? $(nproc) : 16 ))
timeout 200 python3 -m pytest --full -q -p no:cacheprovider -n "$w" tests/test_wgmma.py "tests/test_backward.py" \
  -k "wgmma" > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -3 "$out/tests.txt"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 $here/sanitize.py > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
timeout 200 python3 experiments/2026-11-27-bwd-atomic-variants/bwd_time.py --phases bwd_mma,bwd_wgmma \
  --out "$out/bwd.json" > "$out/bwd.txt" 2>&1
echo "time rc $?"; grep -v -i warn "$out/bwd.txt" | tail -6
if [ "${SWEEP:-1}" = 1 ]; then
  timeout 200 python3 $here/sweep.py --out "$out/sweep.json" > "$out/sweep.txt" 2>&1
  echo "sweep rc $?"; grep -v -i warn "$out/sweep.txt" | tail -6
fi
