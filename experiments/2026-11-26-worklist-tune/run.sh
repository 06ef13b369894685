#!/usr/bin/env bash
# paged_worklist's block shape tuned at ragged B8 H32 KV <= 4k D128 P64 fp16 (CUPTI kernel time): warps 4, 8, 16;
# keys per lane group 0 (auto), 1, 2, 4; blocks per SM 1, 2, 3; lanes per key 0 (auto), 8, 32; one work list per
# KV head filling the SMs once (workers 0), 16-bit loads. Then the default and the best three beside the
# contiguous twin in two bench processes. About 9 minutes on one H100 or H200.
#   bash experiments/2026-11-26-worklist-tune/run.sh OUT
set -u
out=${1:?usage: run.sh OUT}; mkdir -p "$out"
here=experiments/2026-11-26-worklist-tune
export NUMBA_ATTN_BACKEND=cuda
if [ "${2:-}" = b ]; then
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
  for run in 1 2; do
    PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" timeout 250 \
      python3 -m numba_attn.cli bench paged --preset paged-ragged-uniform --setup presets --timing cupti \
      --phases paged_worklist,pwl_k4b1,pwl_w4k4b3,pwl_w4k2b3,paged_split_k,psk_k4b1,decode_split_k_lean \
      --results "$out/shapes.jsonl" --plots "" > "$out/bench-b-$run.txt" 2>&1
    echo "bench $run rc=$?"
    grep -aE "^(paged|pwl|psk|decode|torch_sdpa )" "$out/bench-b-$run.txt" | grep -E "µs|ms" | cut -c1-150
  done
  exit 0
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
cat "$out/gpu.txt"
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" timeout 420 python3 -m numba_attn.cli tune paged_worklist \
  --setup presets --preset paged-ragged-4k --timing cupti --gpu --budget 400s --strategy random --seed 1 \
  --space paged_worklist.warps=4,8,16 --space paged_worklist.keys=0,1,2,4 \
  --space paged_worklist.blocks_per_sm=1,2,3 --space paged_worklist.lanes=0,8,32 \
  --space paged_worklist.workers=0 --space paged_worklist.wide=False \
  --cache "$out/tune-cache.json" --results "$out/tune.jsonl" > "$out/tune.txt" 2>&1
echo "tune rc=$?"; tail -25 "$out/tune.txt" | cut -c1-160
python3 - "$out/tune.jsonl" <<'PY' > "$out/best.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ok = sorted((r for r in rows if r.get("status") == "OK" and r.get("time_ms")), key=lambda r: r["time_ms"])
for r in ok[:12]:
    print(f'{r["time_ms"] * 1e3:8.1f} us  {r.get("params")}  regs={r.get("regs")} local={r.get("local_bytes")}')
print(len(ok), "OK rows of", len(rows))
PY
cat "$out/best.txt"
# b (about 5 minutes): the best three shapes (pwl_k4b1, pwl_w4k4b3, pwl_w4k2b3; presets.py) beside the default,
#   paged_split_k with 4 keys at one block per SM and the twin, on the ragged targets and B8 at uniform lengths, two
#   bench processes:  bash run.sh OUT b
