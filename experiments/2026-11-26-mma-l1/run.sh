#!/usr/bin/env bash
# decode_mma's and paged_mma's ring copies through L1 (l1: cp.async.ca) against the default cp.async.cg:
#   bash experiments/2026-11-26-mma-l1/run.sh OUT
# memcheck of the l1 GPU test and the decode_mma tests; Nsight Compute of one checked launch per case
# (launch_l1.py: L2 sectors and requests, DRAM bytes, time); then CUPTI kernel times (bench paged, preset gqa-l1)
# in two processes. About 8 minutes on one H100 or H200.
set -u
out=${1:?usage: run.sh OUT}; mkdir -p "$out"
here=experiments/2026-11-26-mma-l1
export NUMBA_ATTN_BACKEND=cuda
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
cat "$out/gpu.txt"
timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python3 -m pytest -q \
  -p no:cacheprovider tests/test_paged.py tests/test_decode.py -k "l1 or decode_mma" > "$out/memcheck.txt" 2>&1
echo "memcheck rc=$?" | tee -a "$out/memcheck.txt"; tail -2 "$out/memcheck.txt"
timeout 150 ncu --clock-control none -k regex:'paged_mma|decode_mma' \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,smsp__inst_executed.sum,launch__registers_per_thread \
  python3 $here/launch_l1.py > "$out/ncu.txt" 2>&1
echo "ncu rc=$?"; grep -E "^[a-z_]+: |duration|bytes_read|pct|requests|sectors|inst_executed|registers" "$out/ncu.txt" | cut -c1-120
for run in 1 2; do
  PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" timeout 150 \
    python3 -m numba_attn.cli bench paged --preset gqa-l1 --setup variants --timing cupti \
    --phases paged_mma,pmma_l1,decode_mma,dmma_l1 --results "$out/mma-l1.jsonl" --plots "" > "$out/bench-$run.txt" 2>&1
  echo "bench $run rc=$?"
  grep -E "^(paged|pmma|dmma|decode|torch_sdpa )" "$out/bench-$run.txt" | grep -E "µs|ms" | cut -c1-130
done
