#!/usr/bin/env bash
# One device call (ONE H200, <= 300 s, prebuilt binaries): Nsight Compute on FP8 v11 GEMM 2 (issue 3's 1150 TFLOP/s at
# K 2048; docs/perf.md "Next steps (end of session 16)" item 2): where the 1-CTA kernel's time goes, and why 2-CTA
# clusters lose there (MEGAMOE_GEMM_CLUSTER=1; session 15) while they win on GEMM 1 (the GEMM 1 points are the
# comparison). Ring depth is ruled out (session 16 call 6, docs/grouped_gemm.md "v11 deep ring").
#   source scripts/use_prebuilt.sh NAME && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_ncu_gemm2.sh
# Per point: the details page (speed of light, warp states, scheduler, memory), the raw metrics and the SASS lines with
# their stall samples (gzipped csv); a short table of duration / throughputs / top stall reasons last. One tgz in $OUT.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
budget_s=${BUDGET_S:-300}; pack_name=unused.tgz  # device_steps.sh needs both (its ncu_* helpers are used)
source "$(dirname "$0")/device_steps.sh"
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; cli=$B/megamoe
ncu_setup
export CUDA_VISIBLE_DEVICES=0
start=$(date +%s)
profile() {  # profile NAME KERNEL-REGEX bench-args...  (skipped once the budget is spent)
  local name=$1 kernel=$2; shift 2
  if [ $(( $(date +%s) - start )) -gt $(( budget_s - 40 )) ]; then echo "$name skipped (budget)"; return; fi
  ncu_profile "$name" "$kernel" 90 "$cli" bench gemm --format fp8 --no-cublas --repeats 2 --experts 32 "$@"
}
# NOTES: --gemms picks the GEMM the bench times, so the regex cannot catch the other one (session 17 call 2's GEMM 1
# points profiled nothing: at dsv3 hidden 7168 GEMM 1 runs sm90_fp8_wide_grouped_gemm_kernel, not the gemm1 kernel).
fp8_gemm='sm90_fp8_(wide_gemm1|wide_grouped_gemm|grouped_gemm)_kernel'
# NOTES: the bench's GEMM-1 main column is the split-N kernel on gate/up-blocked weights unless --gemm1-v9 on
# --gemm1-v11 on (interleaved weights, v11: what the staged layer runs at large M); session 18 call 4's GEMM 1 points
# lacked them and profiled sm90_fp8_grouped_gemm_kernel<1, 2, 4, SwiGLU, serial> instead of v11.
v11_gemm1="--gemm1-v9 on --gemm1-v11 on"
# Budget order (session 18: after the TMA-store epilogue, GEMM 1 and qwen3-30b first; NCU_POINTS=all adds the rest).
# NCU_POINTS=g1: the two v11 GEMM 1 points only.
[ "${NCU_POINTS:-}" != g1 ] && MEGAMOE_GEMM_CLUSTER=0 profile g2_qwen3_r1024_c0 "$fp8_gemm" --gemms 2 --models qwen3-30b --rows 1024
profile g1_qwen3_r1024 "$fp8_gemm" --gemms 1 $v11_gemm1 --models qwen3-30b --rows 1024
profile g1_dsv3_r1024 "$fp8_gemm" --gemms 1 $v11_gemm1 --models dsv3 --rows 1024
[ "${NCU_POINTS:-}" != g1 ] && MEGAMOE_GEMM_CLUSTER=0 profile g2_dsv3_r1024_c0 "$fp8_gemm" --gemms 2 --models dsv3 --rows 1024
if [ "${NCU_POINTS:-}" = all ]; then
  MEGAMOE_GEMM_CLUSTER=1 profile g2_dsv3_r1024_c1 "$fp8_gemm" --gemms 2 --models dsv3 --rows 1024
  MEGAMOE_GEMM_CLUSTER=0 profile g2_dsv3_spread512_c0 "$fp8_gemm" --gemms 2 --models dsv3 --rows 512 --rows-spread multinomial
  MEGAMOE_GEMM_CLUSTER=0 profile g1_dsv3_r1024_c0 "$fp8_gemm" --gemms 1 $v11_gemm1 --models dsv3 --rows 1024
fi
rm -f "$logs"/*.ncu-rep
tar -czf "$out/ncu_gemm2.tgz" -C "$logs" .
# NOTES: the tensor-pipe metric is sm__pipe_tensor_cycles_active on this ncu (the gmma-specific names matched nothing
# in session 17 call 2).
print_ncu_summary "Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|SM Frequency" \
  12 6 "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed|smsp__inst_executed.sum "
