#!/usr/bin/env bash
# One device call (2 x H200, <= 340 s): MEGAMOE_EP_OVERLAP=1 (fused dispatch: send + receive in one kernel;
# fused combine: send + wait + reduce in one kernel, docs/ep.md "Overlap") against MEGAMOE_EP_OVERLAP=0 (the
# two-kernel paths), from ONE prebuilt binary set (branch ep-overlap). Carry .xfer/pre-ep-overlap + .xfer/ep-overlap.
# (1) with MEGAMOE_EP_OVERLAP=1: EpSingle.* + StagedPhaseTiming.* on one GPU, EpMulti.* + MegaMulti.*Matches* at 2
#     ranks (bit-exact dispatch/combine, overlap 0 vs 1 bit for bit, staged vs reference + graph replay, capacity,
#     stalled peer in dispatch and in combine); the *Overlap copies of tests are left out (the environment already
#     selects the fused path for every test; OverlapMatchesTwoKernelPath pins 0 and 1 itself).
# (2) bench ep 4096 / 8192 tokens x 7168, top-8 of 256, overlap 0 / 1 alternating; (3) staged dsv3 fp8_block layer
#     on 2 ranks at 2048 / 8192 tokens, 0 / 1 alternating. Round 1 of (2) and (3) before round 2, so a short budget
#     still has one round of each; round 1 also times overlap 1 with MEGAMOE_EP_OVERLAP_DISPATCH=0 (fused combine,
#     two-kernel dispatch). Order (budget 330 s; a step is cut to what is left): EpSingle (~15 s), EpMulti (~100 s),
#     bench ep round 1 (~25 s), layer round 1 (~22 s), bench ep round 2 (~16 s), MegaMulti.*Matches*, layer round 2.
#     Table last.
#   source scripts/use_prebuilt.sh ep-overlap .xfer/ep-overlap && OUT=$OUT bash .xfer/ep-overlap/scripts/gpu_ep_overlap.sh
# Session 16: the fused dispatch is now the warp-role kernel (branch dispatch-roles); its side-by-side call against
# the two-kernel dispatch (tests, bench ep d0 / d1 in two rounds, piece sweep, staged layer) is
# scripts/gpu_dispatch_roles.sh. This script still runs with any prebuilt set: source use_prebuilt.sh NAME first.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
budget_s=${BUDGET_S:-330}; pack_name=ep_overlap.tgz
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/device_steps.sh"
if [ -z "${PREBUILT:-}" ]; then
  source scripts/use_prebuilt.sh ep-overlap .xfer/ep-overlap >/dev/null || exit 1
fi
B=$PREBUILT
echo "binaries: $B ($(sed -n 's/^commit=//p' "$B/PATHS" 2>/dev/null))"

MEGAMOE_EP_OVERLAP=1 step test_gpu_ep 45 "$B/tests/megamoe_tests_gpu" \
  --gtest_filter='EpSingle.*:StagedPhaseTiming.*-*Overlap'
MEGAMOE_EP_OVERLAP=1 step test_multi_ep 110 env MEGAMOE_TEST_RANKS=2 MEGAMOE_TEST_LAUNCH_TIMEOUT_S=60 \
  "$B/tests/megamoe_tests_multigpu" --gtest_filter='EpMulti.*-*Overlap'

ep_round() {
  local round=$1 v tokens
  for tokens in 4096 8192; do
    for v in 0 1; do
      MEGAMOE_EP_OVERLAP=$v step "ep_${tokens}_o${v}_r$round" 20 "$B/megamoe" bench ep --ranks 2 --tokens "$tokens" \
        --hidden 7168 --top-k 8 --experts 256 --iters 20
    done
  done
}
layer_round() {
  local round=$1 v
  for v in 0 1; do
    MEGAMOE_EP_OVERLAP=$v step "layer_o${v}_r$round" 45 "$B/megamoe" bench layer --backend staged --ranks 2 \
      --preset dsv3 --format fp8_block --tokens 2048,8192 --iters 6 --json "$logs/layer_o${v}_r$round.json"
  done
}
ep_round 1
for tokens in 4096 8192; do  # fused combine beside the two-kernel dispatch (MEGAMOE_EP_OVERLAP_DISPATCH=0)
  MEGAMOE_EP_OVERLAP=1 MEGAMOE_EP_OVERLAP_DISPATCH=0 step "ep_${tokens}_o1d0_r1" 20 "$B/megamoe" bench ep --ranks 2 \
    --tokens "$tokens" --hidden 7168 --top-k 8 --experts 256 --iters 20
done
layer_round 1
ep_round 2
MEGAMOE_EP_OVERLAP=1 step test_multi_mega 150 env MEGAMOE_TEST_RANKS=2 MEGAMOE_TEST_LAUNCH_TIMEOUT_S=60 \
  "$B/tests/megamoe_tests_multigpu" --gtest_filter='MegaMulti.*Matches*'
print_test_counts
layer_round 2

cp "$logs"/test_*.log "$out/" 2>/dev/null
print_summary
print_ep_table
python3 "$here/scripts/layer_phases_table.py" "$logs"
