#!/usr/bin/env bash
# bwd_wgmma_ss with less shared-memory traffic against the tree at OLD: memcheck over the odd shapes, the GPU tests of
# the backward, then the sweep (fp16 B1 H32 N4096, D 64/128, causal and not, beside SDPA cuDNN; CUPTI, one process
# each) for this tree and for OLD (a directory holding the earlier commit's numba_attn/ and
# experiments/2026-11-27-bwd-wgmma/), one after the other on the same GPU.
# Usage, from the project root: OUT=dir OLD=dir [DTYPE=float16] bash experiments/2026-11-28-bwd-smem/run.sh
set -u
sweep=experiments/2026-11-27-bwd-wgmma/sweep.py
out=${OUT:-/tmp/bwd-smem}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
cfg='{"bwd_wgmma_ss": {}}'
if [ "${MEMCHECK:-1}" = 1 ]; then
  timeout 200 compute-sanitizer --tool memcheck --print-limit 5 python3 experiments/2026-11-27-bwd-wgmma/sanitize.py \
    --phases bwd_wgmma_ss,bwd_wgmma_fused > "$out/memcheck.txt" 2>&1
  echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -4
fi
if [ "${TESTS:-1}" = 1 ]; then
  timeout 200 python3 -m pytest -q -x tests/test_backward.py -k "wgmma_ss or wgmma_fused" > "$out/tests.txt" 2>&1
  echo "tests rc $?"; tail -2 "$out/tests.txt"
fi
for tree in new old; do
  dir=.; [ "$tree" = old ] && dir=${OLD:-}
  [ -n "$dir" ] || continue
  (cd "$dir" && timeout 200 python3 "$sweep" --dtype "${DTYPE:-float16}" --out "$out/sweep-$tree.json" \
      --configs "$cfg") > "$out/sweep-$tree.txt" 2>&1
  echo "$tree rc $?"; grep -v -i warn "$out/sweep-$tree.txt" | tail -6
done
gzip -f "$out"/*.txt
