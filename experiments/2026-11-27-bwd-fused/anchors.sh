#!/usr/bin/env bash
# bwd_wgmma_fused in the backward benchmark beside bwd_wgmma_overlap and SDPA cuDNN; issue 41's anchor problems
# (bf16 B1 H32 N8192 D128 causal beside cuDNN's and FlexAttention's backward; a 1024-key window at N8192, fp16).
# Usage, from the project root with numba-cuda working: OUT=dir bash experiments/2026-11-27-bwd-fused/anchors.sh
# (PEERS=torch_sdpa_cudnn_backward,torch_flex_backward,fa4_backward adds FlashAttention-4's backward where installed)
set -u
out=${OUT:-/tmp/bwd-anchors}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$out/gpu.txt"
timeout 280 python3 -m numba_attn.cli bench backward --timing cupti --phases bwd_wgmma_overlap,bwd_wgmma_fused \
  --results "$out/backward.jsonl" --plots "$out/plots" > "$out/bench.txt" 2>&1
echo "bench rc $?"; grep -v -i warn "$out/bench.txt" | tail -14
timeout 200 python3 -m numba_attn.cli run --gpu --phases bwd_wgmma_overlap,bwd_wgmma_fused -B 1 -H 32 -N 8192 -D 128 \
  --causal --dtype bf16 --timing cupti --peers ${PEERS:-torch_sdpa_cudnn_backward,torch_flex_backward} \
  --results "$out/anchor.jsonl" > "$out/anchor.txt" 2>&1
echo "anchor rc $?"; grep -v -i warn "$out/anchor.txt" | tail -8
timeout 200 python3 experiments/2026-11-27-bwd-window/bwd_window.py --phase bwd_wgmma_fused --sizes 8192 --dims 128 \
  --out "$out/window.json" > "$out/window.txt" 2>&1
echo "window rc $?"; grep -v -i warn "$out/window.txt" | tail -4
rm -rf "$out/plots"
