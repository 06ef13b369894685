#!/usr/bin/env bash
# fp8_wgmma after the quantization kernels' rework (16-byte loads, enough blocks per head, V transposed through
# shared memory) on one H200: the phase's GPU tests (the quantization kernels against the NumPy model, larger
# shapes against float64), then fp8_wgmma beside SDPA fp16 (auto and cuDNN) at B1 H32 N8192 D128, non-causal
# and causal, CUPTI kernel time (each row carries its kernels' times: quantization and attention apart).
# About 3 minutes; its time limits add up to 4.
#   bash experiments/2026-11-23-fp8-forward/quant.sh OUT
set -u
out=${1:?usage: quant.sh OUT}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_forward.py > "$out/tests.log" 2>&1
echo "tests: exit $?"; tail -2 "$out/tests.log"
for causal in "" "--causal"; do
  name=fp8${causal:+-causal}
  timeout 75 python3 -m numba_attn.cli run --gpu --phases fp8_wgmma -B 1 -H 32 -N 8192 -D 128 --dtype float16 \
    $causal --seeds 1 --timing cupti --peers torch_sdpa,torch_sdpa_cudnn --no-ceilings \
    --results "$out/fp8.jsonl" > "$out/$name.log" 2>&1
  echo "$name: exit $?"; grep -E "^(fp8|torch)" "$out/$name.log"
done
python3 - "$out/fp8.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("phase") == "fp8_wgmma" and r.get("cupti_kernels"):
        ks = []
        for k in r["cupti_kernels"]:
            n = k["name"].split("[")[0].split("::")
            ks.append((n[-1] if n[-1] == "fp8_wgmma" else ".".join(n[-3::2]), round(k["time_ms"], 4)))
        print(r["label"], round(r["time_ms"], 4), ks)
PY
