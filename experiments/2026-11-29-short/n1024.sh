#!/usr/bin/env bash
# B8 H32/8kv N1024 D128 bf16 causal (issue 42: 0.92x cuDNN, under the 0.95x target): ws_tma_q_early's tile space
# tuned (warpgroups 2/3, Bc 64/128, stages 2/3, uniform), then its default and the tune's fastest configuration
# beside cuDNN (one process each, 3 interleaved rounds, CUPTI).
#   OUT=dir bash experiments/2026-11-29-short/n1024.sh        (about 3 minutes on an H200)
set -u
out=${OUT:-/tmp/n1024}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
prob="-B 8 -H 32 --kv-heads 8 -N 1024 -D 128 --dtype bf16 --causal"
timeout 200 python3 -m numba_attn.cli tune ws_tma_q_early --gpu $prob --timing cupti --cache "$out/cache.json" \
  --results "$out/tune.jsonl" > "$out/tune.txt" 2>&1
echo "tune rc $?"; grep -E "^\[[ 0-9]+/" "$out/tune.txt" | sed 's/ (.*//' | tail -24
best=$(python3 - "$out/tune.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ok = [r for r in rows if r.get("type") == "result" and r.get("status") == "OK" and r.get("time_ms")]
r = min(ok, key=lambda r: r["time_ms"])
print(" ".join(f"--param ws_tma_q_early.{k}={v}" for k, v in r["params"].items() if k != "blocks"))
PY
)
echo "fastest: $best"
for cfg in default best; do
  args=""; [ $cfg = best ] && args="$best"
  timeout 120 python3 -m numba_attn.cli run --gpu $prob --timing cupti --rounds 3 --phases ws_tma_q_early,ws_tma_q \
    $args --peers torch_sdpa_cudnn --results "$out/rows.jsonl" > "$out/run-$cfg.txt" 2>&1
  echo "run $cfg rc $?"; grep -E "^(ws_|torch_)" "$out/run-$cfg.txt"
done
gzip -f "$out"/*.txt "$out"/*.jsonl
