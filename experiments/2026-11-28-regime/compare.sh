#!/usr/bin/env bash
# Phases and peers in one regime (issue 42): warp_specialized_tc against SDPA cuDNN at B1 H32 N4096 D128 fp16, all
# CUPTI kernel time. The runner twice per regime (standalone: each row alone, as the committed rows were taken;
# interleaved: the problem's rows again in rounds), then the independent alternating measurement (numba_attn.measure
# .alternate) in a burst after idle (2 s idle, 3 warm-ups, 10 calls) and sustained (~3 s of calls per segment).
# About 3-4 minutes of GPU time. Usage, from the project root: OUT=dir bash experiments/2026-11-28-regime/compare.sh
set -u
here=$(dirname "$0")
out=${OUT:-/tmp/regime}; mkdir -p "$out"
export NUMBA_ATTN_BACKEND=cuda PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv \
  > "$out/gpu.txt" 2>&1
python3 -c "import pynvml" > /dev/null 2>&1 && echo "NVML: pynvml" > "$out/nvml.txt" || \
  echo "NVML: pynvml not importable (cuda.bindings.nvml tried next; pip install nvidia-ml-py)" > "$out/nvml.txt"
shape="-B 1 -H 32 -N 4096 -D 128 --dtype float16"
run="python3 -m numba_attn.cli run --gpu --phases ${PHASE:-warp_specialized_tc} --peers torch_sdpa_cudnn --no-ceilings --timing cupti"
run="$run --budget 1 --timeout 120 --seeds 1 $shape"
for rep in 1 2; do
  for regime in standalone interleaved; do
    timeout 200 $run --regime "$regime" --rounds 5 --results "$out/run-$regime.jsonl" \
      > "$out/run-$regime-$rep.txt" 2>&1
    echo "run $regime $rep rc $?"
  done
done
alt="python3 -m numba_attn.measure.alternate --phase ${PHASE:-warp_specialized_tc} --backend cudnn $shape"
timeout 150 $alt --rounds 5 --warmup 3 --calls 10 --idle 2 --out "$out/alternate-burst.json" \
  > "$out/alternate-burst.txt" 2>&1
echo "alternate burst rc $?"
timeout 150 $alt --rounds 3 --warmup 3 --calls 6000 --out "$out/alternate-sustained.json" \
  > "$out/alternate-sustained.txt" 2>&1
echo "alternate sustained rc $?"
python3 "$here/summarize.py" "$out" | tee "$out/summary.txt"
