#!/usr/bin/env bash
# B16 H16 N512 D64 fp16 (issue 42's short-sequence problem, 0.83-0.84x cuDNN): ws_tma_q_wide's tile space tuned
# (warpgroups 2/3, Bc 64/128, stages 2/3, uniform), then the best configurations beside cuDNN in one process.
#   OUT=dir bash experiments/2026-11-29-short/run.sh        (about 4 minutes on an H200)
set -u
out=${OUT:-/tmp/short}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
prob="-B 16 -H 16 -N 512 -D 64 --dtype fp16"
timeout 240 python3 -m numba_attn.cli tune ws_tma_q_wide --gpu $prob --timing cupti --cache "$out/cache.json" \
  --results "$out/tune.jsonl" > "$out/tune.txt" 2>&1
echo "tune rc $?"; grep -v -i warn "$out/tune.txt" | tail -20
for wg in 2 3; do
  timeout 120 python3 -m numba_attn.cli run --gpu $prob --timing cupti --rounds 3 --phases ws_tma_q_wide,tma_wgmma \
    --param ws_tma_q_wide.warpgroups=$wg --peers torch_sdpa_cudnn --results "$out/rows.jsonl" > "$out/run-wg$wg.txt" 2>&1
  echo "run wg$wg rc $?"; grep -E "^(ws_|tma_|torch_)" "$out/run-wg$wg.txt"
done
gzip -f "$out"/*.txt "$out"/*.jsonl
