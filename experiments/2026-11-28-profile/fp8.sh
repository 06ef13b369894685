#!/usr/bin/env bash
# fp8_ws under Nsight Compute beside SDPA cuDNN's fp16 forward (B1 H32 N4096 D128, not causal): the full set for the
# attention kernels (the quantization kernels too), then the warp-state samples per SASS instruction of fp8_ws.
# OUT=dir bash experiments/2026-11-28-profile/fp8.sh
set -u
here=$(dirname "$0")
export FWD_PHASE=fp8_ws
timeout 150 ncu --profile-from-start off --set full --import-source no --page details \
    python3 "$here/profile.py" 128 0 fwd,cudnn_fwd > "$OUT/ncu-fp8-d128-c0.txt" 2>&1
echo "ncu rc $?"
WHICH=fwd KERNEL=regex:fp8_ws timeout 150 bash "$here/stalls.sh"
echo "stalls rc $?"
gzip -f "$OUT"/*.txt
