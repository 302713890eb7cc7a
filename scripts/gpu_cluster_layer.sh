#!/usr/bin/env bash
# One device call (2 x H200, <= 360 s): main with the v11 GEMM-1 clusters on by default (docs/grouped_gemm.md "v11
# clusters"): the whole one-GPU suite (sharded over both GPUs), the whole 2-rank suite, then bench layer FP8 on 2 ranks,
# staged + mega, MEGAMOE_GEMM_CLUSTER=0 ("m0" in the table) against the default ("m1"), alternating processes: dsv3 at
# 2048 / 8192 tokens (two rounds), ms4 / qwen3-30b (one round). Prebuilt: scripts/prebuild.sh NAME, carried as a tgz.
#   source scripts/use_prebuilt.sh NAME && OUT=$OUT bash scripts/gpu_cluster_layer.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; T=$B/tests
budget_s=${BUDGET_S:-360}; pack_name=cluster_layer.tgz
source scripts/device_steps.sh
step_sharded_gpu_suite test_gpu 170 "$T/megamoe_tests_gpu"
step test_multigpu 220 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
print_test_counts
for round in 1 2; do for c in 0 1; do
  for model in dsv3 ms4 qwen3-30b; do
    [ "$round" = 2 ] && [ "$model" != dsv3 ] && continue
    if [ "$c" = 0 ]; then set_cluster=(env MEGAMOE_GEMM_CLUSTER=0); else set_cluster=(env); fi
    step "layer_${model}_m${c}_$round" 45 "${set_cluster[@]}" "$B/megamoe" bench layer --backend staged,mega \
      --ranks 2 --preset "$model" --format fp8_block --tokens 2048,8192 --iters 6 --json "$logs/layer_${model}_m${c}_$round.json"
  done
done; done
print_summary
echo "(m0 = MEGAMOE_GEMM_CLUSTER=0, m1 = the default: GEMM 1 in clusters at K >= 4096)"
python3 scripts/tile_order_table.py "$logs"
pack
