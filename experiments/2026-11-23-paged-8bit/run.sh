#!/usr/bin/env bash
# Issue 18 after the 8-bit dequantization without integer-to-float conversions and the ragged split plan:
#  1. the GPU tests of the paged phases, the new intrinsics and the Hopper blocks;
#  2. whether warp_specialized_tc's SASS keeps setmaxnreg (USETMAXREG) and its registers;
#  3. numba-attn bench paged --preset paged-targets-short (CUPTI kernel time; SDPA on the contiguous twins).
#   OUT=dir bash experiments/2026-11-23-paged-8bit/run.sh
#   WIDE=1 OUT=dir bash ...: then also paged_split_k with wide=True (16 codes per lane per load) on the same problems
set -u
out=${OUT:-results/paged-check}; mkdir -p "$out"
python3 -m pytest -q -p no:cacheprovider -n 8 tests/test_paged.py tests/test_intrinsics.py tests/test_hopper.py \
  > "$out/tests.log" 2>&1; echo "tests: exit $?"; tail -2 "$out/tests.log"
python3 - > "$out/sass.txt" 2>&1 <<'PY'
import sys
sys.path.insert(0, "tests")
from numba_attn.spec.problem import Problem
from test_tensor_core import run_phase  # plan, launch on poisoned output, check against float64
for D in (128, 64):
    p = Problem(batch=1, heads=8, q_len=1024, head_dim=D, dtype="float16")
    c, launch = run_phase("warp_specialized_tc", p, seed=1)
    k = launch.kernels[0]
    for sig, ov in k.overloads.items():
        sass = k.inspect_sass(sig)
        print(f"D{D} ok={c.ok} regs={ov.regs_per_thread} USETMAXREG={sass.count('USETMAXREG')} "
              f"UTMALDG={sass.count('UTMALDG')} HGMMA={sass.count('HGMMA')}")
PY
cat "$out/sass.txt" | tail -3
python3 -m numba_attn.cli bench paged --preset paged-targets-short --timing cupti --results "$out/paged.jsonl" \
  --plots "$out/plots" > "$out/bench.log" 2>&1; echo "bench: exit $?"
if [ "${WIDE:-0}" = 1 ]; then
  python3 -m numba_attn.cli run --gpu --preset paged-targets-short --phases paged_split_k \
    --param paged_split_k.wide=1 --timing cupti --no-ceilings --results "$out/paged.jsonl" > "$out/wide.log" 2>&1
  echo "wide: exit $?"
fi
