#!/usr/bin/env bash
# One device call (ONE H200, <= 150 s, prebuilt w4a8-v9): Nsight Compute of the W4A8 BF16-out kernels at dsv3 GEMM 2,
# 1024 rows per expert, nvfp4: today's 128 x 256 split-N kernel vs v9 (256 x 128 M-split, half the decode per FLOP,
# measured 0.82-0.90x in session 17 call 3), and today's GEMM 1 kernel, so that the next W4A8 design starts from
# where the time goes. Per point: details, raw metrics, SASS stall samples (gzipped csv). One tgz in $OUT.
#   source scripts/use_prebuilt.sh w4a8-v9 .xfer/w4a8-v9 && PREBUILT=$PREBUILT OUT=$OUT bash .xfer/w4a8-v9/scripts/gpu_ncu_w4a8_v9.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; cli=$B/megamoe
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
export CUDA_VISIBLE_DEVICES=0
profile() {  # profile NAME KERNEL-REGEX bench-args...
  local name=$1 kernel=$2; shift 2
  timeout 60 "$ncu_bin" --clock-control none --kernel-name "regex:$kernel" --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section LaunchStats --section Occupancy --section SourceCounters --import-source no \
    -o "$logs/$name" "$cli" bench gemm --no-cublas --repeats 2 --experts 32 --format nvfp4 --models dsv3 --rows 1024 "$@" \
    >"$logs/$name.run.log" 2>&1
  echo "$name rc=$?"
  "$ncu_bin" --import "$logs/$name.ncu-rep" --page details --print-units base >"$logs/$name.details.txt" 2>&1
  "$ncu_bin" --import "$logs/$name.ncu-rep" --page raw --print-units base >"$logs/$name.raw.txt" 2>&1
  "$ncu_bin" --import "$logs/$name.ncu-rep" --page source --print-source sass --csv >"$logs/$name.sass.csv" 2>&1
  gzip -f "$logs/$name.sass.csv"
}
MEGAMOE_W4A8_V9=0 profile w4a8_g2_default sm90_w4a8_grouped_gemm_kernel --gemms 2
MEGAMOE_W4A8_V9=1 profile w4a8_g2_v9 sm90_w4a8_m_split --gemms 2
MEGAMOE_W4A8_V9=0 profile w4a8_g1_default sm90_w4a8_grouped_gemm_kernel --gemms 1
rm -f "$logs"/*.ncu-rep
tar -czf "$out/ncu_w4a8_v9.tgz" -C "$logs" .
for f in "$logs"/*.details.txt; do
  echo "== $(basename "$f" .details.txt)"
  grep -E "SM Frequency|Duration|Compute \(SM\) Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|Registers Per" "$f" | head -10
  grep -E "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed|smsp__inst_executed.sum |l1tex__data_pipe_lsu_wavefronts_mem_shared.sum " "${f%.details.txt}.raw.txt" | awk '{print $1, $NF}'
  grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio" "${f%.details.txt}.raw.txt" | \
    awk '{print $NF, $1}' | sort -rn | head -7
done
