#!/usr/bin/env bash
# Where the decode targets that issue 18 still misses lose their time (H200; README.md has the predictions).
#   bash experiments/2026-11-26-decode-profile/run.sh OUT a|b
# a (about 4 minutes): Nsight Compute over one checked launch of each case of launch_cases.py (the contiguous twin,
#   paged_split_k and paged_worklist at uniform lengths with the shuffled and the identity table, paged_worklist on
#   the ragged B8 KV <= 4k target, the 8-bit caches at B8 KV 16k), boost clocks left alone.
# b (about 3 minutes): CUPTI kernel times of the preset paged-identity (identity_table.py: the uniform B8 KV 2024
#   batch with its pages shuffled and in order) for paged_split_k, paged_worklist and the contiguous twin, two runs.
# c (about 2 minutes): Nsight Compute's breakdown of the L2 and DRAM throughput, and the L1 and L2 request counts,
#   of the twin, paged_split_k at uniform lengths and the int8 caches (per head, per token).
# d (about 2 minutes): CUPTI kernel times of the preset paged-one-head (one_head.py: the same batch as 256 sequences
#   of one head, P64 and P256) for paged_split_k beside the contiguous twin, two runs.
# e (about 4 minutes): CUPTI kernel times of the preset paged-one-head-16k (one_head.py: B8 H32 against B256 H1 at
#   16k keys a sequence, an int8 cache with a per-head scale and fp16) for paged_split_k beside the contiguous twins.
# f (about 6 minutes): compute-sanitizer memcheck of the head_group tests (tests/test_paged.py), then CUPTI kernel
#   times of paged_split_k with head_group 1 (the default), 2, 4 and 8 (head_group.py) on the 8-bit caches at
#   B8 H32 KV 16k (int8/head, int8/token, fp8/head) beside the contiguous fp16 twin and SDPA.
# g (about 6 minutes): the same at KV 32k, without the memcheck.
# h (about 6 minutes): memcheck of the step_heads tests, then CUPTI kernel times of paged_split_k with step_heads 1
#   (the default), 2, 4 and 8 (step_heads.py) on the 8-bit caches at B8 H32 KV 16k beside the twin and SDPA.
# i (about 6 minutes): the same at KV 32k, without the memcheck.
# j (about 8 minutes): the new default (step_heads 2) beside step_heads 1 (psk_sh1) and the twin at KV 16k and 32k,
#   one process: a second sample of the gain.
# Any other GPU than an H200 stops the script at once (exit 3) unless ANY_GPU=1.
set -u
out=${1:?usage: run.sh OUT a|b|c|d|e|f|g|h|i|j}; part=${2:?usage: run.sh OUT a|b|c|d|e|f|g|h|i|j}; mkdir -p "$out"
here=experiments/2026-11-26-decode-profile
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $name"
case "$name" in *H200*) ;; *) [ "${ANY_GPU:-0}" = 1 ] || { echo "not an H200: stopping"; exit 3; } ;; esac
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv > "$out/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 > "$out/clocks-$part.csv" &
smi=$!
trap 'kill $smi 2>/dev/null' EXIT
if [ "$part" = a ]; then
  NUMBA_ATTN_BACKEND=cuda timeout 420 ncu --clock-control none -k regex:'decode_split_k_lean|paged_split_k|paged_worklist' \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    --section Occupancy --section LaunchStats \
    --metrics dram__bytes_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct,smsp__inst_executed.sum \
    python3 $here/launch_cases.py > "$out/ncu-a.txt" 2>&1
  echo "ncu rc=$?"; grep -E "^[a-z0-9_]+: " "$out/ncu-a.txt"
  grep -E "Duration|DRAM Throughput|Memory Throughput|dram__bytes_read|Issue Slots Busy|Eligible Warps|Registers Per|Achieved Occupancy|Stall Long|L2 Hit Rate|smsp__inst_executed" "$out/ncu-a.txt" | head -120
elif [ "$part" = b ]; then
  for r in 1 2; do
    PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" NUMBA_ATTN_BACKEND=cuda timeout 200 \
      python3 -m numba_attn.cli bench paged --preset paged-identity --setup identity_table \
      --timing cupti --phases paged_split_k,paged_worklist,decode_split_k_lean \
      --results "$out/paged-identity.jsonl" --plots "" 2>&1 | tee "$out/bench-b$r.txt" \
      | grep -E "^(paged|decode)" | grep -E "µs|ms" | tail -12
  done
elif [ "$part" = c ]; then
  NUMBA_ATTN_BACKEND=cuda timeout 300 ncu --clock-control none -k regex:'decode_split_k_lean|paged_split_k' \
    --metrics breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,breakdown:dram__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,gpu__time_duration.sum,dram__bytes_read.sum \
    python3 $here/launch_cases.py twin psk_uniform int8_head int8_token > "$out/ncu-c.txt" 2>&1
  echo "ncu rc=$?"; grep -E "^[a-z0-9_]+: |^  make_|pct|requests|sectors|duration|bytes" "$out/ncu-c.txt" | cut -c1-110
elif [ "$part" = d ]; then
  for r in 1 2; do
    PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" NUMBA_ATTN_BACKEND=cuda timeout 200 \
      python3 -m numba_attn.cli bench paged --preset paged-one-head --setup one_head \
      --timing cupti --phases paged_split_k,decode_split_k_lean \
      --results "$out/paged-one-head.jsonl" --plots "" 2>&1 | tee "$out/bench-d$r.txt" \
      | grep -E "^(paged|decode)" | grep -E "µs|ms" | tail -12
  done
elif [ "$part" = e ]; then
  PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" NUMBA_ATTN_BACKEND=cuda timeout 400 \
    python3 -m numba_attn.cli bench paged --preset paged-one-head-16k --setup one_head \
    --timing cupti --phases paged_split_k,decode_split_k_lean \
    --results "$out/paged-one-head-16k.jsonl" --plots "" 2>&1 | tee "$out/bench-e.txt" \
    | grep -E "^(paged|decode|torch_sdpa )" | grep -E "µs|ms" | tail -16
elif [ "$part" = f ] || [ "$part" = g ] || [ "$part" = h ] || [ "$part" = i ] || [ "$part" = j ]; then
  # f, g: head_group (head_group.py, needs 75e82a4); h, i: step_heads (step_heads.py); j: the default beside S = 1
  case $part in
    f|g) setup=head_group; name=paged-head-group; phases=paged_split_k,psk_hg2,psk_hg4,psk_hg8 ;;
    h|i) setup=step_heads; name=paged-step-heads; phases=paged_split_k,psk_sh2,psk_sh4,psk_sh8 ;;
    j) setup=step_heads; name=paged-default; phases=paged_split_k,psk_sh1 ;;
  esac
  if [ "$part" = f ] || [ "$part" = h ]; then
    NUMBA_ATTN_BACKEND=cuda timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 \
      python3 -m pytest -q -p no:cacheprovider tests/test_paged.py -k "$setup or mma_8bit_paged_split_k" \
      > "$out/memcheck-$part.txt" 2>&1
    echo "memcheck rc=$?" | tee -a "$out/memcheck-$part.txt"; tail -3 "$out/memcheck-$part.txt"
  fi
  case $part in f|h) presets="--preset paged-8bit-16k" ;; g|i) presets="--preset paged-8bit-32k" ;;
    j) presets="--preset paged-8bit-16k --preset paged-8bit-32k" ;; esac
  PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" NUMBA_ATTN_BACKEND=cuda timeout 540 \
    python3 -m numba_attn.cli bench paged $presets --setup $setup \
    --timing cupti --phases $phases,decode_split_k_lean \
    --results "$out/$name.jsonl" --plots "" 2>&1 | tee "$out/bench-$part.txt" \
    | grep -E "^(paged|psk|decode|torch_sdpa )" | grep -E "µs|ms" | tail -24
fi
