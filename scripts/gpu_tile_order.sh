#!/usr/bin/env bash
# One device call (2 x H200, <= 540 s): may MEGAMOE_GEMM_M_FASTEST=1 (v11 tiles m-fastest inside an expert,
# docs/grouped_gemm.md "Tile order") become the default? Prebuilt: scripts/prebuild.sh main; carry .xfer/pre-main as a tgz.
#   source scripts/use_prebuilt.sh main && OUT=$OUT bash scripts/gpu_tile_order.sh
# (1) the whole one-GPU suite (sharded over both GPUs) and (2) the whole 2-rank suite, both with the switch ON;
# (3) bench gemm fp8, 128 experts, rows per expert multinomial at means 256 / 512 / 1024, dsv3 / ms4 / qwen3-30b,
# switch 0 / 1 in alternating processes, two rounds; (4) bench layer FP8 on 2 ranks, staged + mega, dsv3 at 2048 / 8192
# tokens (two rounds) and ms4 / qwen3-30b (one round), 0 / 1 alternating. Table last.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh main first}; T=$B/tests
budget_s=${BUDGET_S:-540}; pack_name=tile_order.tgz
source scripts/device_steps.sh
export MEGAMOE_GEMM_M_FASTEST=1
step_sharded_gpu_suite test_gpu 190 "$T/megamoe_tests_gpu"
step test_multigpu 240 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
print_test_counts
for round in 1 2; do for mf in 0 1; do
  step "gemm_m${mf}_$round" 25 env MEGAMOE_GEMM_M_FASTEST=$mf "$B/megamoe" bench gemm --format fp8 \
    --models dsv3 ms4 qwen3-30b --rows 256 512 1024 --experts 128 --rows-spread multinomial --no-cublas --repeats 10 \
    --json "$logs/gemm_m${mf}_$round.json"
done; done
for round in 1 2; do for mf in 0 1; do
  for model in dsv3 ms4 qwen3-30b; do
    [ "$round" = 2 ] && [ "$model" != dsv3 ] && continue
    step "layer_${model}_m${mf}_$round" 45 env MEGAMOE_GEMM_M_FASTEST=$mf "$B/megamoe" bench layer --backend staged,mega \
      --ranks 2 --preset "$model" --format fp8_block --tokens 2048,8192 --iters 6 --json "$logs/layer_${model}_m${mf}_$round.json"
  done
done; done
print_summary
python3 scripts/tile_order_table.py "$logs"
pack
