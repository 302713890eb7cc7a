#!/usr/bin/env bash
# One device call (ONE H200, <= 420 s), session 26: the gather design end to end, on binaries prebuilt from a tree with
# docs/experiments/session26-gather.patch applied (NOT merged; `git apply` it, then scripts/prebuild.sh gather-eval): the
# dispatcher's gather mode + the v11 GEMM-1 gather. The EP dispatch stores each token once
# per rank (MEGAMOE_EP_GATHER=1, docs/ep.md "Gather mode") and GEMM 1 gathers its A rows (docs/grouped_gemm.md "v11 GEMM
# 1 gather"). Everything is packed into $OUT/gather_eval.tgz after every step. Steps:
# (1) the gather dispatch bit-exact against expand (one rank and in-process ranks), the dispatch / combine regressions,
#     then the staged layer gather == expand tests (in their own process: see the helper's note).
# (2) bench ep --loopback, 4096 x 7168, top-8 of 256, 1 and 2 ranks, expand / gather, two rounds.
# (3) bench layer, staged, one rank, dsv3 with 128 experts, fp8_block, 4096 and 8192 tokens, MEGAMOE_EP_GATHER 0 / 1,
#     two rounds (split disp / g1 / g2 / comb).
#   source scripts/use_prebuilt.sh gather-eval && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_gather_eval.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}
budget_s=${BUDGET_S:-420}; pack_name=gather_eval.tgz
source "$(dirname "$0")/device_steps.sh"
export CUDA_VISIBLE_DEVICES=0 MEGAMOE_TEST_LAUNCH_TIMEOUT_S=150
step gtest_dispatch 150 "$B/tests/megamoe_tests_gpu" --gtest_filter='EpSingle.GatherMatchesExpandBitExact:Ranks/EpLoopback.GatherMatchesExpandBitExact/*:EpSingle.DispatchCombineBitExact*:EpSingle.OverlapMatchesTwoKernelPath:Ranks/EpLoopback.DispatchCombineBitExact*/2ranks:Ranks/EpLoopback.OverlapMatchesTwoKernelPath/2ranks'
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$logs/gtest_dispatch.log"
step gtest_staged 150 "$B/tests/megamoe_tests_gpu" --gtest_filter='EpSingle.StagedGatherMatchesExpand:Ranks/EpLoopback.StagedGatherMatchesExpand/*'
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$logs/gtest_staged.log"
for round in 1 2; do
  for ranks in 1 2; do
    for mode in expand gather; do
      flag=""; [ "$mode" = gather ] && flag=--gather
      step "ep_${ranks}r_${mode}_$round" 40 "$B/megamoe" bench ep --loopback --ranks "$ranks" --tokens 4096 --hidden 7168 \
        --top-k 8 --experts 256 $flag
    done
  done
  for g in 0 1; do
    step "layer_g${g}_$round" 60 env MEGAMOE_EP_GATHER=$g "$B/megamoe" bench layer --backend staged --ranks 1 \
      --preset dsv3 --experts 128 --format fp8_block --tokens 4096,8192 --iters 10 --json "$logs/layer_g${g}_$round.json"
  done
done
pack
print_summary
echo; echo "bench ep (loopback, 4096 x 7168): dispatch / combine lines"
for f in "$logs"/ep_*.log; do echo "== $(basename "$f" .log)"; grep -iE "dispatch|combine" "$f" | grep -v "^#" | head -4; done
echo; echo "bench layer (staged, one rank, dsv3 128 experts)"
for f in "$logs"/layer_*.log; do echo "== $(basename "$f" .log)"; grep -E "staged" "$f" | head -3; done
