#!/usr/bin/env bash
# fp8_ws on a GPU: memcheck of a few odd shapes, the FP8 GPU tests, the kernels' registers as loaded, then fp8_ws
# beside fp8_wgmma, warp_specialized_tc (fp16) and SDPA cuDNN fp16 at B1 H32 N8192
# D128 (causal and not) and B4 H32 N2048 D64, CUPTI kernel time of every kernel of a call (the quantization counted).
#   OUT=dir bash experiments/2026-11-28-fp8-ws/run.sh          (at most 7.5 minutes)
set -u
out=${OUT:-/tmp/fp8-ws}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda MPLBACKEND=Agg PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv > "$out/gpu.txt"
timeout 75 compute-sanitizer --tool memcheck --print-limit 5 python3 - > "$out/memcheck.txt" 2>&1 <<'PY'
import numpy as np
from numba import cuda
from numba_attn import Problem, get_phase
from numba_attn.measure.check import to_device
from numba_attn.spec.reference import check, reference
ph = get_phase("fp8_ws")
bad = 0
for p, params in [(Problem(batch=1, heads=4, kv_heads=2, q_len=333, kv_len=517, head_dim=128, dtype="float16"), {}),
                  (Problem(batch=2, heads=2, q_len=200, kv_len=300, head_dim=64, dtype="bfloat16", causal=True), {}),
                  (Problem(batch=1, heads=2, q_len=129, kv_len=129, head_dim=128, dtype="float16", causal=True),
                   {"Bc": 64, "stages": 4})]:
    q, k, v = p.inputs(3)
    B, H, Hkv, Nq, Nk, D = p.batch, p.heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim
    launch = ph.plan(p, **ph.resolve(p, params))
    o = to_device(np.full((B * H, Nq, D), np.nan, q.dtype))
    launch(to_device(np.ascontiguousarray(q.reshape(B * H, Nq, D))),
           to_device(np.ascontiguousarray(k.reshape(B * Hkv, Nk, D))),
           to_device(np.ascontiguousarray(v.reshape(B * Hkv, Nk, D))), o)
    c = check(o.copy_to_host().view(q.dtype).reshape(q.shape), reference(q, k, v, causal=p.causal), dtype=p.dtype,
              precision=ph.precision)
    print(p.label, params, c.ok, c.rel_err)
    bad += not c.ok
print("ALL OK" if not bad else f"FAIL {bad}")
PY
echo "memcheck rc $?"; grep -E "FAIL|ALL OK|ERROR SUMMARY" "$out/memcheck.txt" | tail -3
[ -n "${MEMCHECK_ONLY:-}" ] && exit 0
timeout 110 python3 -m pytest --full -q -x -p no:cacheprovider tests/test_fp8_forward.py -k fp8_ws > "$out/tests.txt" 2>&1
echo "tests rc $?"; tail -1 "$out/tests.txt"
while read -r args; do
  echo "## $args"
  timeout 75 python3 -m numba_attn.cli run --gpu --phases fp8_ws,fp8_wgmma,warp_specialized_tc \
    --peers torch_sdpa_cudnn --no-ceilings $args --timing cupti --timeout 30 \
    --results "$out/fp8ws.jsonl" 2>&1 | tee -a "$out/run.txt" | grep -E "^(fp8|warp_specialized_tc|torch_sdpa)"
done <<'PROBLEMS'
-B 1 -H 32 -N 8192 -D 128 --dtype float16
-B 1 -H 32 -N 8192 -D 128 --dtype float16 --causal
-B 4 -H 32 -N 2048 -D 64 --dtype float16
PROBLEMS
tar -czf "$out/logs.tar.gz" -C "$out" gpu.txt memcheck.txt tests.txt run.txt && rm -f "$out"/*.txt "$out"/*.lock
