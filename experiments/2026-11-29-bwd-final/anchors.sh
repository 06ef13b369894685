#!/usr/bin/env bash
# Issue 41's anchor problems at one commit: the backward (phase=None's bwd_wgmma_ss at D128) beside cuDNN's and
# FlexAttention's backward, and the forward (phase=None's choice on an H200) beside cuDNN's; CUPTI, one process a
# problem, 3 interleaved rounds, every output checked against float64 before and after timing.
#   OUT=dir bash experiments/2026-11-29-bwd-final/anchors.sh        (about 4 minutes on an H200)
# (PEERS=torch_sdpa_cudnn_backward,torch_flex_backward,fa4_backward adds FlashAttention-4's backward where installed)
set -u
out=${OUT:-/tmp/bwd-anchors}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
peers=${PEERS:-torch_sdpa_cudnn_backward,torch_flex_backward}
run() { timeout 150 python3 -m numba_attn.cli run --gpu --timing cupti --rounds 3 -B 1 -H 32 "$@" --results "$out/anchor.jsonl"; }
run --phases bwd_wgmma_ss -N 8192 -D 128 --causal --dtype bf16 --peers "$peers" > "$out/bwd-8192.txt" 2>&1
echo "bwd 8192 rc $?"; grep -v -i warn "$out/bwd-8192.txt" | tail -5
run --phases bwd_wgmma_ss -N 4096 -D 128 --dtype fp16 --peers "$peers" > "$out/bwd-4096.txt" 2>&1
echo "bwd 4096 rc $?"; grep -v -i warn "$out/bwd-4096.txt" | tail -5
run --phases ws_tma_q_early -N 8192 -D 128 --causal --dtype bf16 --peers torch_sdpa_cudnn > "$out/fwd-8192.txt" 2>&1
echo "fwd 8192 rc $?"; grep -v -i warn "$out/fwd-8192.txt" | tail -4
run --phases ws_tma_q -N 4096 -D 128 --dtype fp16 --peers torch_sdpa_cudnn > "$out/fwd-4096.txt" 2>&1
echo "fwd 4096 rc $?"; grep -v -i warn "$out/fwd-4096.txt" | tail -4
gzip -f "$out"/*.txt "$out"/*.jsonl
