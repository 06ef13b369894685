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
