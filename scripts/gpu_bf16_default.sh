#!/usr/bin/env bash
# One device call (2 x H200, <= 300 s): BF16 clusters as the default where the hidden size is >= 4096 (session 16;
# docs/grouped_gemm.md "BF16 clusters"). Prebuilt: scripts/prebuild.sh NAME; carry .xfer/pre-NAME as a tgz.
#   source scripts/use_prebuilt.sh NAME && OUT=$OUT bash scripts/gpu_bf16_default.sh
# (1) every BF16 test at the defaults: GroupedGemmBf16.* and the bf16 backend / model cases on one GPU (sharded over
# both), MegaMulti.Bf16* on 2 ranks; (2) bench layer bf16, 2 ranks, staged + mega, dsv3 / ms4 / qwen3-30b at
# 2048 / 8192 tokens, MEGAMOE_BF16_CLUSTER=0 beside the default. Table last (session 16 call 5 printed the ratio too:
# docs/runs/session16_call5/, docs/grouped_gemm.md "BF16 clusters").
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; T=$B/tests
budget_s=${BUDGET_S:-300}; pack_name=bf16_default.tgz
source scripts/device_steps.sh
export GTEST_FILTER='*Bf16*:*bf16*'
step_sharded_gpu_suite test_gpu 100 "$T/megamoe_tests_gpu"
unset GTEST_FILTER
step test_multigpu 90 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu" --gtest_filter='MegaMulti.Bf16*'
print_test_counts
for model in dsv3 ms4 qwen3-30b; do
  for c in 0 default; do
    e=(); [ "$c" = 0 ] && e=(MEGAMOE_BF16_CLUSTER=0)
    step "layer_${model}_c$c" 40 env "${e[@]}" "$B/megamoe" bench layer --backend staged,mega --ranks 2 --preset "$model" \
      --format bf16 --tokens 2048,8192 --iters 6 --json "$logs/layer_${model}_c$c.json"
  done
done
print_summary
python3 scripts/layer_phases_table.py "$logs"  # layer_<model>_c0 (clusters off) beside layer_<model>_cdefault
pack
