#!/usr/bin/env bash
# bwd_wgmma_ss under Nsight Compute beside SDPA cuDNN's backward (fp16 B1 H32 N4096 D128, not causal): the full set
# for both kernels, then the warp-state samples per SASS instruction of grad_ss.
# OUT=dir bash experiments/2026-11-28-profile/ss.sh
set -u
here=$(dirname "$0")
export BWD_PHASE=bwd_wgmma_ss
ncu --profile-from-start off --set full --import-source no --page details \
    python3 "$here/profile.py" 128 0 bwd,cudnn_bwd > "$OUT/ncu-ss-d128-c0.txt" 2>&1
echo "ncu rc $?"
WHICH=bwd KERNEL=regex:grad_ss bash "$here/stalls.sh"
echo "stalls rc $?"
gzip -f "$OUT"/*.txt
