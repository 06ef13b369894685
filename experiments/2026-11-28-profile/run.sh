#!/usr/bin/env bash
# Nsight Compute over profile.py: numba-attn's backward and forward against SDPA cuDNN's kernels, same problem.
# OUT=dir bash experiments/2026-11-28-profile/run.sh
set -u
here=$(dirname "$0")
for case in "128 0" "128 1"; do
  set -- $case
  ncu --profile-from-start off --set full --import-source no --page details \
      python3 "$here/profile.py" "$1" "$2" > "$OUT/ncu-d$1-c$2.txt" 2>&1
  ncu --profile-from-start off --metrics sass__inst_executed_per_opcode \
      --print-metric-instances values --page raw \
      python3 "$here/profile.py" "$1" "$2" > "$OUT/ops-d$1-c$2.txt" 2>&1
done
gzip -f "$OUT"/*.txt
