#!/usr/bin/env bash
# One device call (ONE H200, <= 240 s, prebuilt binaries with the small-M kInterleaved8 mode): Nsight Compute on the
# W4A8 kernels (docs/perf.md "Next steps (end of session 18)" item 4, and session 19's small-M regression):
# (1) GEMM 1 at 8 rows, nvfp4 dsv3: the 2-warpgroup kernel on kGateUp W13 (MEGAMOE_W4A8_G1_V10 unset; what the old
#     path runs at rows hints <= 32) vs the small-M kernel's kInterleaved8 mode (=1), which ran 0.91-0.93x of it in
#     session 19 call 1: instructions by opcode (the SASS csv) and stall reasons.
# (2) the two v10 kernels at 1024 rows, nvfp4 dsv3 (GEMM 1 on interleaved W13, GEMM 2): tensor-pipe activity and where
#     the math warps stall now that both epilogues are cheap (session 17's 30-34% was measured on the old skeleton).
#   source scripts/use_prebuilt.sh NAME && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_ncu_w4a8_g1.sh
# One tgz in $OUT (details, raw metrics, SASS with stall samples per point); a short table last.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
budget_s=${BUDGET_S:-240}; pack_name=unused.tgz
source "$(dirname "$0")/device_steps.sh"
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; cli=$B/megamoe
ncu_setup
export CUDA_VISIBLE_DEVICES=0
start=$(date +%s)
profile() {  # profile NAME KERNEL-REGEX G1_V10 bench-args...  (skipped once the budget is spent)
  local name=$1 kernel=$2 g1=$3; shift 3
  if [ $(( $(date +%s) - start )) -gt $(( budget_s - 40 )) ]; then echo "$name skipped (budget)"; return; fi
  MEGAMOE_W4A8_G1_V10=$g1 ncu_profile "$name" "$kernel" 75 "$cli" bench gemm --format nvfp4 --no-cublas --repeats 2 \
    --experts 32 --models dsv3 --rows-spread none "$@"
}
profile g1_2wg_old_r8 'sm90_w4a8_grouped_gemm_kernel' 0 --gemms 1 --rows 8
profile g1_small_int_r8 'sm90_w4a8_small_m_grouped_gemm_kernel' 1 --gemms 1 --rows 8
profile g1_v10_r1024 'sm90_w4a8_v10_gemm1_kernel' 1 --gemms 1 --rows 1024
profile g2_v10_r1024 'sm90_w4a8_v10_grouped_gemm_kernel' 0 --gemms 2 --rows 1024
rm -f "$logs"/*.ncu-rep
tar -czf "$out/ncu_w4a8_g1.tgz" -C "$logs" .
print_ncu_summary "Duration|DRAM Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|SM Frequency|Registers Per|Shared Memory Configuration Size" \
  14 7 "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed|smsp__inst_executed.sum "
