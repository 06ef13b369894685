#!/usr/bin/env bash
# The new default's rows for the backward roadmap (bwd_wgmma_ss beside its parent bwd_wgmma_fused and SDPA's
# backends, `numba-attn bench backward`, CUPTI), then the training run of experiments/2026-11-27-train with the
# backward default (train.py --steps 500 --seed 1).
#   OUT=dir bash experiments/2026-11-28-bwd-smem/bench-train.sh        (about 5 minutes)
set -u
out=${OUT:-/tmp/bench-train}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 230 python3 -m numba_attn.cli bench backward --timing cupti --phases bwd_wgmma_fused,bwd_wgmma_ss \
  --max-total 200 --results "$out/backward.jsonl" --plots "$out" > "$out/bench.txt" 2>&1
echo "bench rc $?"; grep -E "bwd_wgmma|cudnn" "$out/bench.txt" | tail -24
timeout 200 python3 experiments/2026-11-27-train/train.py --steps 500 --seed 1 --out "$out/train.json" \
  --plot "$out/loss.png" > "$out/train.txt" 2>&1
echo "train rc $?"; grep -v -i warn "$out/train.txt" | tail -12
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt bench.txt train.txt && rm -f "$out"/*.txt "$out"/*.lock
