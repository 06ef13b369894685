#!/usr/bin/env bash
# fp8_wgmma (FP8 e4m3 forward, per-head scales) on one H200:
#  1. the GPU tests of the new phase (tests/test_fp8_forward.py: the e4m3 packer's PTX, the quantization kernels,
#     larger shapes against float64) and of the e4m3 wgmma;
#  2. registers and spills of the attention kernel as loaded (numba's own compile for the device);
#  3. fp8_wgmma (default, and 2 warpgroups with Bc=128) vs tc_wgmma vs SDPA fp16 at B1 H32 N8192 D128,
#     non-causal and causal, CUPTI kernel time (the quantization kernels are counted in fp8_wgmma's time).
# Usage: bash experiments/2026-11-23-fp8-forward/run.sh OUT      (about 5-6 minutes; its time limits add up to 7.4)
set -u
OUT=${1:-/tmp/fp8-forward}
mkdir -p "$OUT"
echo "${NUMBA_ATTN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}" > "$OUT/commit.txt"
nvidia-smi -L > "$OUT/gpus.txt" 2>&1

timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_forward.py tests/test_wgmma.py -k "fp8 or e4m3 or pack" \
  > "$OUT/tests.log" 2>&1; echo "tests: exit $?"; tail -3 "$OUT/tests.log"

timeout 45 python3 - > "$OUT/regs.txt" 2>&1 <<'PY'
import numpy as np
from numba import cuda
from numba_attn import Problem, get_phase
ph = get_phase("fp8_wgmma")
for causal in (False, True):
    for params in ({}, {"warpgroups": 2, "Bc": 128, "stages": 3}):
        p = Problem(batch=1, heads=32, q_len=8192, head_dim=128, dtype="float16", causal=causal)
        launch = ph.plan(p, **params)
        q = cuda.to_device(np.zeros((32, 8192, 128), np.float16))
        o = cuda.device_array_like(q)
        launch(q, q, q, o)
        cuda.synchronize()
        k = launch.kernels[0]
        for sig, ov in k.overloads.items():
            print(f"causal={causal} params={launch.params} regs={ov.regs_per_thread} "
                  f"local={getattr(ov, 'local_mem_per_thread', '?')}")
PY
tail -4 "$OUT/regs.txt"

for causal in "" "--causal"; do
  name=fp8${causal:+-causal}
  timeout 110 python3 -m numba_attn.cli run --gpu --phases fp8_wgmma,tc_wgmma -B 1 -H 32 -N 8192 -D 128 \
    --dtype float16 $causal --seeds 1 --timing cupti --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings --results "$OUT/fp8.jsonl" > "$OUT/$name.log" 2>&1
  echo "$name: exit $?"; tail -8 "$OUT/$name.log"
done
timeout 60 python3 -m numba_attn.cli run --gpu --phases fp8_wgmma --param fp8_wgmma.warpgroups=2 \
  --param fp8_wgmma.Bc=128 --param fp8_wgmma.stages=3 -B 1 -H 32 -N 8192 -D 128 --dtype float16 \
  --seeds 1 --timing cupti --no-peers --no-ceilings --results "$OUT/fp8.jsonl" > "$OUT/fp8-wg2-bc128.log" 2>&1
echo "fp8-wg2-bc128: exit $?"; tail -4 "$OUT/fp8-wg2-bc128.log"
