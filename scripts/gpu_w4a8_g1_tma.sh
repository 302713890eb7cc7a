#!/usr/bin/env bash
# One device call (ONE H200, <= 240 s): W4A8 v10 GEMM 1's TMA-store epilogue (docs/grouped_gemm.md "W4A8 v10 GEMM 1
# TMA-store epilogue") against a baseline build of main (per-row bulk copies), through scripts/gpu_tma_store.sh's
# knobs: MEGAMOE_W4A8_G1_V10=1 in the environment (`megamoe bench gemm` packs W13 kGateUpInterleaved8 and runs v10
# GEMM 1 in both builds), FORMATS="nvfp4 mxfp4", GEMMS=1, TEST_FILTER='GroupedGemmW4a8.W4a8V10*' (v10 GEMM 1 vs the
# old kernels byte for byte, W4a8V10Gemm1TmaStoreWarpShapes included; v10 GEMM 2 / plain), memcheck of
# W4a8V10Gemm1TmaStoreWarpShapes (every warp shape: full warps by TMA store, partial last warps by per-row copies).
# Steps: tests, bench round 1 (dsv3 ms4 qwen3-30b, 32 experts, exact 1024 / 4096 and multinomial 512, base vs branch
# in alternating processes), memcheck, bench round 2, the table last (TFLOP/s base, tma, tma / base).
# Everything is packed into $OUT/tma_store.tgz after every step.
#   tar -xzf .xfer/callN.tgz && source scripts/use_prebuilt.sh base && BASE_PREBUILT=$PREBUILT && \
#     source scripts/use_prebuilt.sh w4a8-g1-tma .xfer/w4a8-g1-tma && BASE_PREBUILT=$BASE_PREBUILT \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/w4a8-g1-tma/scripts/gpu_w4a8_g1_tma.sh
set -uo pipefail
export MEGAMOE_W4A8_G1_V10=1
export FORMATS=${FORMATS:-nvfp4 mxfp4} GEMMS=1 BENCH_ARGS=${BENCH_ARGS:-}
export TEST_FILTER=${TEST_FILTER:-GroupedGemmW4a8.W4a8V10*}
export MEMCHECK_FILTER=${MEMCHECK_FILTER:-GroupedGemmW4a8.W4a8V10Gemm1TmaStoreWarpShapes}
export BUDGET_S=${BUDGET_S:-240}
exec bash "$(dirname "$0")/gpu_tma_store.sh"
