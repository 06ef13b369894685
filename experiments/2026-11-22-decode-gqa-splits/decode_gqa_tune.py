"""Split-count tuning for grouped-query decode (the GQA miss in docs/decode-notes.md).

At B=1 with 8 KV heads the planner's default (blocks_per_sm=4, min_keys=256)
makes 66 splits of 512 keys; this sweeps fewer, longer splits. Every row goes
through the runner (correctness on two seeds, events timing, graph-replay
cross-check, which keeps the two-launch phase's host launch cost out).

    python experiments/2026-11-22-decode-gqa-splits/decode_gqa_tune.py OUT.jsonl
"""
import json
import sys

from numba_attn import Problem
from numba_attn.measure.peers import measure_peer
from numba_attn.measure.config import RunConfig
from numba_attn.measure.row import measure
from numba_attn.measure.timing import TimingConfig

out = open(sys.argv[1], "a")
cfg = RunConfig(seeds=(1, 2), compare_timing=True, timing=TimingConfig(budget_s=0.3, min_reps=5))
shapes = [Problem(batch=1, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16"),
          Problem(batch=8, heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="float16"),
          Problem(batch=1, heads=32, q_len=1, kv_len=16384, head_dim=128, dtype="float16")]
variants = [(4, 256), (2, 1024), (1, 2048), (2, 2048), (1, 4096), (4, 1024)]
for p in shapes:
    rows = [measure_peer("torch_sdpa", p, cfg)]
    for name in ("decode_split_k", "decode_split_k_fused"):
        for bps, mk in variants:
            rows.append(measure(name, p, cfg, blocks_per_sm=bps, min_keys=mk))
    for r in rows:
        out.write(json.dumps(r, default=str) + "\n")
        out.flush()
        tc = r.get("timing_check") or {}
        g = tc.get("second_ms")
        t = g if g else r.get("time_ms")
        gb = p.min_bytes() / (t * 1e-3) / 1e9 if t else None
        prm = {k: r.get("params", {}).get(k) for k in ("blocks_per_sm", "min_keys")}
        print(f"{p.label:32s} {r['phase']:22s} {str(prm):38s} {r['status']:5s} "
              f"events {r.get('time_ms') or 0:8.4f} ms graph {g or 0:8.4f} ms  {gb or 0:6.0f} GB/s  "
              f"{r.get('reason', '')[:60]}", flush=True)
