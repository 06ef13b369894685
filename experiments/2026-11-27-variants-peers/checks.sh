#!/usr/bin/env bash
# Variants on a GPU: `tests` (the variant tests with the CUDA backend), `memcheck` (every variant phase under
# compute-sanitizer), `models` (the five model rows). Usage, from the project root with numba-cuda working:
#   OUT=dir bash experiments/2026-11-27-variants-peers/checks.sh tests|memcheck|models
set -u
here=experiments/2026-11-27-variants-peers
out=${OUT:-/tmp/variants-checks}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu-$1.txt"
case $1 in
tests)
  w=$(( $(nproc) < 16 ? $(nproc) : 16 ))
  timeout 400 python3 -m pytest --full -q -p no:cacheprovider -n "$w" tests/test_variants.py tests/test_variants_tc.py \
    tests/test_decode_variants.py tests/test_variants_splitk.py tests/test_transformers.py > "$out/tests.txt" 2>&1
  echo "tests rc $?"; tail -4 "$out/tests.txt";;
memcheck)
  timeout 500 compute-sanitizer --tool memcheck --print-limit 5 python3 $here/sanitize.py > "$out/memcheck.txt" 2>&1
  echo "memcheck rc $?"; tail -40 "$out/memcheck.txt";;
models)
  timeout 500 python3 $here/models.py --out "$out/models.json" > "$out/models.txt" 2>&1
  echo "models rc $?"; cut -c1-600 "$out/models.txt";;
esac
