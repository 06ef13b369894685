#!/usr/bin/env bash
# Second pass over ws_intra_kv and ws_intra_qs after kv-qs.sh: wider tiles and a third stage for ws_intra_kv at D128,
# the D256 two-consumer tile in bf16 and causal, the two long causal problems, then ws_intra_qs's GPU head-dim test.
#   OUT=dir bash experiments/2026-11-28-ws-intra/kv-qs-2.sh        (about 9 minutes)
set -u
out=${OUT:-/tmp/ws-intra-kv-qs-2}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
D128="-B 1 -H 32 -N 4096 -D 128"
while read -r phases args; do
  echo "## $phases $args"
  timeout 90 python3 -m numba_attn.cli run --gpu --phases "$phases" --peers torch_sdpa_cudnn --no-ceilings $args \
    --timing cupti --timeout 40 --results "$out/kvqs2.jsonl" 2>&1 | tee -a "$out/run.txt" | grep -E "^(ws_|tma_|torch_sdpa)"
done <<PROBLEMS
ws_intra,ws_intra_kv,ws_intra_qs $D128 --dtype float16 --param ws_intra_kv.Bc=144 --param ws_intra_qs.Bc=144
ws_intra,ws_intra_kv $D128 --dtype float16 --param ws_intra_kv.stages=3
ws_intra,ws_intra_kv,ws_intra_qs $D128 --dtype bfloat16 --param ws_intra_kv.Bc=144 --param ws_intra_qs.Bc=128
tma_wgmma,ws_intra_qs -B 1 -H 16 -N 4096 -D 256 --dtype bfloat16
tma_wgmma,ws_intra_qs -B 1 -H 16 -N 8192 -D 256 --dtype float16 --causal
ws_intra,ws_intra_kv -B 1 -H 32 --kv-heads 8 -N 8192 -D 128 --dtype bfloat16 --causal
ws_intra,ws_intra_kv -B 1 -H 32 -N 16384 -D 128 --dtype bfloat16 --causal
PROBLEMS
timeout 240 python3 -m pytest --full -q -p no:cacheprovider tests/test_head_dims.py -m gpu -k "ws_intra_qs" \
  > "$out/headdims.txt" 2>&1
echo "head dims rc $?"; tail -1 "$out/headdims.txt"; grep -a FAILED "$out/headdims.txt" | head -5
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt headdims.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
