#!/usr/bin/env bash
# One device call (2 x H200, <= 560 s): may the fused combine become the default? (docs/ep.md "Overlap", "Measured";
# docs/perf.md session 15 call K ran out of time.) Prebuilt: scripts/prebuild.sh NAME; carry .xfer/pre-NAME as a tgz.
#   source scripts/use_prebuilt.sh NAME && OUT=$OUT bash scripts/gpu_fused_combine.sh
# With MEGAMOE_EP_OVERLAP=1 MEGAMOE_EP_OVERLAP_DISPATCH=0 (fused combine, two-kernel dispatch): (1) the whole one-GPU
# suite (sharded over both GPUs), (2) the whole 2-rank suite, then (3) bench ep 4096 / 8192 with the combine lag at
# 0 / 128 / 512 (MEGAMOE_EP_COMBINE_LAG) beside the two-kernel combine. Table last.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; T=$B/tests
budget_s=${BUDGET_S:-560}; pack_name=fused_combine.tgz
source scripts/device_steps.sh
export MEGAMOE_EP_OVERLAP=1 MEGAMOE_EP_OVERLAP_DISPATCH=0
step_sharded_gpu_suite test_gpu 200 "$T/megamoe_tests_gpu"
step test_multigpu 300 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
print_test_counts
for tokens in 4096 8192; do
  MEGAMOE_EP_OVERLAP=0 step "ep_${tokens}_two_kernel" 20 "$B/megamoe" bench ep --ranks 2 --tokens "$tokens" \
    --hidden 7168 --top-k 8 --experts 256 --iters 20
  for lag in 0 128 512; do
    MEGAMOE_EP_COMBINE_LAG=$lag step "ep_${tokens}_lag$lag" 20 "$B/megamoe" bench ep --ranks 2 --tokens "$tokens" \
      --hidden 7168 --top-k 8 --experts 256 --iters 20
  done
done
print_summary
print_ep_table
pack
