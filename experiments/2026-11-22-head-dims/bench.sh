#!/usr/bin/env bash
# phase=None at fp16 head_dim 64 … 256 (B1 H32 N4096): the phase explain() picks, timed by the runner
# beside SDPA fp16 (the same timing method for both). Usage: OUT=dir bash experiments/2026-11-22-head-dims/bench.sh
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
for D in 64 80 96 128 160 256; do
  ph=$(python3 -c "
import numba_attn as na
from numba_attn.spec.problem import Problem
p = Problem(heads=32, q_len=4096, kv_len=4096, head_dim=$D, dtype='float16')
e = na.explain(*p.inputs(seed=1))
print(f'D=$D phase=None -> {e.phase.name} {e.params}: {e.why}', file=open('$OUT/explain.txt', 'a'))
print(e.phase.name)" 2>>"$OUT/bench.log" | tail -1)
  numba-attn run --gpu --phases "$ph" -B 1 -H 32 -N 4096 -D $D --dtype float16 --no-ceilings \
    --peers torch_sdpa_fp16 --results "$OUT/head-dims.jsonl" --timeout 120 >> "$OUT/bench.log" 2>&1
done
cat "$OUT/explain.txt"
