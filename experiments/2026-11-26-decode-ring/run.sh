#!/usr/bin/env bash
# paged_split_k's cp.async ring (stages) on the 8-bit caches (H200; README.md has the prediction).
#   bash experiments/2026-11-26-decode-ring/run.sh OUT a|b
# a (about 8 minutes): compute-sanitizer memcheck of the stages tests (tests/test_paged.py), then CUPTI kernel times
#   of paged_split_k (the default, direct loads) and stages 2, 3, 4 (ring.py) at B8 H32 D128 P64 KV 16k (int8/head,
#   int8/token, fp8/head) beside the contiguous fp16 twin and SDPA.
# b (about 6 minutes): the same at KV 32k, without the memcheck.
# c (about 8 minutes): KV 16k and 32k in one process, without the memcheck and the two-block 4 stages (one block per SM
#   fits anyway): the H200 run after a and b ran on an H100.
# d (about 4 minutes, two GPUs): c's phases, KV 16k on GPU 0 and KV 32k on GPU 1 at once (one process each).
# e (about 2 minutes): Nsight Compute of int8/head KV 16k with the direct loads, 2 stages, and 3 stages at one block per
#   SM (launch_ring.py): DRAM and L2 fabric activity, L2 requests and sectors, eligible warps.
# f (about 8 minutes): Nsight Compute of int8/token and int8/head KV 16k, direct loads against 3 stages at one block
#   per SM (launch_ring.py, with the warp state section); then on an H200 only the CUPTI times of the default, 2 stages
#   and 3 stages at one block per SM at KV 16k and 32k in one process, beside SDPA on the fp16 twins. On any other GPU
#   part f runs the Nsight Compute half alone.
# g (about 9 minutes): after the ring's address arithmetic was hoisted out of the key loop (7a4b01e; then with
#   int8's per-token scales queued in registers instead of copied): memcheck of the stages tests; then on an H200
#   part f's CUPTI times, on any other GPU part f's Nsight Compute with 2 stages as well.
# Any other GPU than an H200 stops the script at once (exit 3) unless ANY_GPU=1 (parts f, g: see above).
set -u
out=${1:?usage: run.sh OUT a|b|c|d|e|f|g}; part=${2:?usage: run.sh OUT a|b|c|d|e|f|g}; mkdir -p "$out"
case "$part" in a|b|c|d|e|f|g) ;; *) echo "unknown part $part (a|b|c|d|e|f|g)"; exit 2 ;; esac
here=experiments/2026-11-26-decode-ring
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
h200=0
case "$name" in *H200*) h200=1 ;; *) [ "${ANY_GPU:-0}" = 1 ] || [ "$part" = f ] || [ "$part" = g ] || { echo "not an H200: stopping"; exit 3; } ;; esac
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 > "$out/clocks-$part.csv" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
if [ "$part" = e ]; then
  NUMBA_ATTN_BACKEND=cuda timeout 400 ncu --clock-control none -k regex:'paged_split_k' \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__ltcfabric2ltc_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,smsp__warps_eligible.avg.per_cycle_active,smsp__inst_executed.sum,launch__registers_per_thread \
    python3 $here/launch_ring.py > "$out/ncu-e.txt" 2>&1
  echo "ncu rc=$?"; grep -E "^[a-z0-9_]+: |^  [a-z_]+|duration|pct|requests|sectors|bytes|eligible|inst_executed|registers" "$out/ncu-e.txt" | cut -c1-120
  exit 0
fi
if [ "$part" = g ]; then
  NUMBA_ATTN_BACKEND=cuda timeout 170 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider tests/test_paged.py -k "stages" > "$out/memcheck-g.txt" 2>&1
  echo "memcheck rc=$?" | tee -a "$out/memcheck-g.txt"; tail -3 "$out/memcheck-g.txt"
fi
if [ "$part" = g ] && [ "$h200" = 0 ]; then
  NUMBA_ATTN_BACKEND=cuda timeout 300 ncu --clock-control none -k regex:'paged_split_k' \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,smsp__warps_eligible.avg.per_cycle_active,smsp__inst_executed.sum,launch__registers_per_thread,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio \
    python3 $here/launch_ring.py direct_tok ring2_tok ring3_b1_tok direct ring2 ring3_b1 > "$out/ncu-g.txt" 2>&1
  echo "ncu rc=$?"; grep -E "^[a-z0-9_]+: |duration|pct|requests|sectors|eligible|inst_executed|registers|stalled" "$out/ncu-g.txt" | cut -c1-120
  exit 0
fi
if [ "$part" = f ] || [ "$part" = g ]; then
  if [ "$part" = f ]; then
  NUMBA_ATTN_BACKEND=cuda timeout 300 ncu --clock-control none -k regex:'paged_split_k' --section WarpStateStats \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__ltcfabric2ltc_cycles_active.avg.pct_of_peak_sustained_elapsed,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,smsp__warps_eligible.avg.per_cycle_active,smsp__inst_executed.sum,launch__registers_per_thread,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
    python3 $here/launch_ring.py direct_tok ring3_b1_tok direct ring3_b1 > "$out/ncu-f.txt" 2>&1
  echo "ncu rc=$?"; grep -E "^[a-z0-9_]+: |duration|pct|requests|sectors|bytes|eligible|inst_executed|registers|Stall|Warp Cycles" "$out/ncu-f.txt" | cut -c1-120
  fi
  [ "$h200" = 1 ] || { echo "not an H200: Nsight Compute only"; exit 0; }
  PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" NUMBA_ATTN_BACKEND=cuda timeout $([ "$part" = g ] && echo 380 || echo 420) \
    python3 -m numba_attn.cli bench paged --preset paged-8bit-16k --preset paged-8bit-32k --setup ring \
    --timing cupti --phases paged_split_k,psk_st2,psk_st3b1 \
    --results "$out/paged-ring.jsonl" --plots "" 2>&1 | tee "$out/bench-$part.txt" \
    | grep -E "^(paged|psk|decode|torch_sdpa )" | grep -E "µs|ms|spill|reg" | tail -30
  exit 0
fi
if [ "$part" = a ]; then
  NUMBA_ATTN_BACKEND=cuda timeout 240 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider tests/test_paged.py -k "stages" > "$out/memcheck-a.txt" 2>&1
  echo "memcheck rc=$?" | tee -a "$out/memcheck-a.txt"; tail -3 "$out/memcheck-a.txt"
  presets="--preset paged-8bit-16k"
elif [ "$part" = b ]; then
  presets="--preset paged-8bit-32k"
else
  presets="--preset paged-8bit-16k --preset paged-8bit-32k"
fi
phases=paged_split_k,psk_st2,psk_st3,psk_st4,psk_st3b1,psk_st4b1,decode_split_k_lean
[ "$part" = c ] || [ "$part" = d ] && phases=paged_split_k,psk_st2,psk_st3,psk_st3b1,psk_st4b1,decode_split_k_lean
if [ "$part" = d ]; then
  for gpu in 0 1; do
    len=$([ $gpu = 0 ] && echo 16k || echo 32k)
    CUDA_VISIBLE_DEVICES=$gpu PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" NUMBA_ATTN_BACKEND=cuda timeout 540 \
      python3 -m numba_attn.cli bench paged --preset paged-8bit-$len --setup ring --timing cupti --phases $phases \
      --results "$out/paged-ring-$len.jsonl" --plots "" > "$out/bench-d-$len.txt" 2>&1 &
  done
  wait
  grep -hE "^(paged|psk|decode|torch_sdpa )" "$out"/bench-d-16k.txt "$out"/bench-d-32k.txt | grep -E "µs|ms" | tail -30
  exit 0
fi
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" NUMBA_ATTN_BACKEND=cuda timeout 560 \
  python3 -m numba_attn.cli bench paged $presets --setup ring \
  --timing cupti --phases $phases \
  --results "$out/paged-ring.jsonl" --plots "" 2>&1 | tee "$out/bench-$part.txt" \
  | grep -E "^(paged|psk|decode|torch_sdpa )" | grep -E "µs|ms|spill|reg" | tail -30
