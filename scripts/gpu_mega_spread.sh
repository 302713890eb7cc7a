#!/usr/bin/env bash
# One device call (2 x H200, <= 560 s) for branch mega-spread (the fused mega kernel's FP8 GEMM 1 with the spread
# SwiGLU epilogue; prebuilt: scripts/prebuild.sh mega-spread in its worktree -> .xfer/pre-mega-spread, made from
# main + that one commit, so it also verifies main). Carry .xfer/pre-mega-spread; from main's root:
#   OUT=$OUT bash scripts/gpu_mega_spread.sh
# Steps: the whole one-GPU suite (sharded over both GPUs); bench layer dsv3 FP8 at 128 and 512 tokens per rank,
# mega fused and staged, MEGAMOE_SWIGLU_SPREAD=0 / 1 alternating, two rounds; the whole 2-rank suite. Last a table.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
source scripts/use_prebuilt.sh mega-spread >/dev/null || exit 1
B=$PREBUILT; T=$B/tests
budget_s=550; pack_name=mega_spread.tgz
source scripts/device_steps.sh
step_sharded_gpu_suite test_gpu 160 "$T/megamoe_tests_gpu"
for round in 1 2; do
  for s in 0 1; do
    step "layer_fused_${s}_$round" 45 env MEGAMOE_SWIGLU_SPREAD=$s "$B/megamoe" bench layer --backend mega \
      --mega-path fused --ranks 2 --preset dsv3 --format fp8_block --tokens 128,512 --iters 10 \
      --json "$logs/layer_fused_${s}_$round.json"
    step "layer_staged_${s}_$round" 40 env MEGAMOE_SWIGLU_SPREAD=$s "$B/megamoe" bench layer --backend staged \
      --ranks 2 --preset dsv3 --format fp8_block --tokens 128,512 --iters 10 --json "$logs/layer_staged_${s}_$round.json"
  done
done
step test_multigpu 240 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
print_test_counts
python3 scripts/layer_ab_table.py "$logs"
print_summary
pack
