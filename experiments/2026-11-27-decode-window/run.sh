#!/usr/bin/env bash
# Decode with a window on a GPU: window.py under memcheck (a small problem), then timed.
# Usage, from the project root with numba-cuda working: OUT=dir bash experiments/2026-11-27-decode-window/run.sh
set -u
here=experiments/2026-11-27-decode-window
out=${OUT:-/tmp/decode-window}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
timeout 150 compute-sanitizer --tool memcheck --print-limit 5 python3 $here/window.py --small --out "$out/small.json" \
  > "$out/memcheck.txt" 2>&1
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|SOME|ERROR SUMMARY" "$out/memcheck.txt" | tail -5
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_decode_variants.py > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -2 "$out/tests.txt"
timeout 200 python3 $here/window.py --out "$out/window.json" > "$out/window.txt" 2>&1
echo "time rc $?"; grep -v -i warn "$out/window.txt" | tail -4
