#!/usr/bin/env bash
# Where a kernel's warps wait: Nsight Compute's warp-state sampling per SASS instruction of one call of profile.py's
# numba-attn backward (or WHICH=fwd: forward), and the stall reasons summed over the kernel.
# OUT=dir [WHICH=bwd] [KERNEL=regex:grad_fused] bash experiments/2026-11-28-profile/stalls.sh
set -u
here=$(dirname "$0")
which=${WHICH:-bwd}; kern=${KERNEL:-regex:grad_fused}
ncu --profile-from-start off --kernel-name "$kern" --section WarpStateStats --section SourceCounters \
    --section SchedulerStats --import-source no --export "$OUT/stalls-$which" \
    python3 "$here/profile.py" 128 0 "$which" > "$OUT/stalls-$which.log" 2>&1
ncu --import "$OUT/stalls-$which.ncu-rep" --page source --csv --print-source sass > "$OUT/sass-$which.csv" 2>&1
ncu --import "$OUT/stalls-$which.ncu-rep" --page raw --csv > "$OUT/raw-$which.csv" 2>&1
rm -f "$OUT/stalls-$which.ncu-rep"
gzip -f "$OUT"/*.csv
