#!/usr/bin/env bash
# One device call (1 H200, prebuilt binaries): Nsight Compute stall reasons of the W4A8 grouped GEMM
# (issue 3: W4A8 streams ~1.9 TB/s at 8-32 rows and runs ~530 TFLOP/s at 1024+, where FP8 runs 3.7 TB/s
# and ~1000 TFLOP/s), with the FP8-block kernel at the same points as the comparison, and the v4
# small-M kernel (sm90_w4a8_small_m_grouped_gemm.cuh) at 8 rows.
#   source scripts/use_prebuilt.sh main && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_ncu_w4a8.sh
# Per point: the details page (speed of light, warp states, scheduler, memory) and the SASS lines with
# the most stall samples. One tgz in $OUT.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
budget_s=${BUDGET_S:-300}; pack_name=unused.tgz  # device_steps.sh needs both (its ncu_* helpers are used)
source "$(dirname "$0")/device_steps.sh"
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; cli=$B/megamoe
ncu_setup
profile() {  # profile NAME KERNEL-REGEX bench-args...
  local name=$1 kernel=$2; shift 2
  ncu_profile "$name" "$kernel" 150 "$cli" bench gemm --no-cublas --repeats 2 --experts 32 "$@"
}
export CUDA_VISIBLE_DEVICES=0
profile w4a8_nvfp4_dsv3_r8 w4a8 --format nvfp4 --models dsv3 --rows 8
profile w4a8_nvfp4_dsv3_r1024 w4a8 --format nvfp4 --models dsv3 --rows 1024
# v4: the small-M kernel (GEMM 1 by default; MEGAMOE_W4A8_SMALL_M=1 puts GEMM 2 on it too)
MEGAMOE_W4A8_SMALL_M=1 profile w4a8_small_m_nvfp4_dsv3_r8 w4a8_small_m --format nvfp4 --models dsv3 --rows 8
profile fp8_dsv3_r8 fp8_grouped --format fp8 --models dsv3 --rows 8
profile fp8_dsv3_r1024 fp8_grouped --format fp8 --models dsv3 --rows 1024
rm -f "$logs"/*.ncu-rep
tar -czf "$out/ncu_w4a8.tgz" -C "$logs" .
print_ncu_summary "sm90_|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Registers Per" 16 8
