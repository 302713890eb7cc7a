#!/usr/bin/env bash
# One device call (2 x H200, <= 560 s) that verifies main after session 11's merge (spread SwiGLU epilogue for
# 64 x 256 GEMM-1 tiles with few rows; W4A8 GEMM 1 on the 2-warpgroup kernel up to 32 rows) and measures its
# layer effect. Prebuilt: scripts/prebuild.sh main; carry .xfer/pre-main; from the checkout's root:
#   OUT=$OUT bash scripts/gpu_session11.sh
# Steps: the whole one-GPU suite (sharded over both GPUs); bench layer dsv3 staged at 128 tokens per rank,
# FP8 / nvfp4 / mxfp4, MEGAMOE_SWIGLU_SPREAD=0 (the old epilogue and kernel choice) and =1 alternating, two
# rounds; the whole 2-rank suite with the time left. Last a table.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
source scripts/use_prebuilt.sh main >/dev/null || exit 1
B=$PREBUILT; T=$B/tests
budget_s=550; pack_name=session11.tgz
source scripts/device_steps.sh
step_sharded_gpu_suite test_gpu 160 "$T/megamoe_tests_gpu"
for round in 1 2; do
  for fmt in fp8_block nvfp4 mxfp4; do
    for s in 0 1; do
      step "layer_${fmt}_${s}_$round" 40 env MEGAMOE_SWIGLU_SPREAD=$s "$B/megamoe" bench layer --backend staged \
        --ranks 2 --preset dsv3 --format $fmt --tokens 128 --iters 10 --json "$logs/layer_${fmt}_${s}_$round.json"
    done
  done
done
step test_multigpu 240 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
print_test_counts
python3 scripts/layer_ab_table.py "$logs"
print_summary
pack
