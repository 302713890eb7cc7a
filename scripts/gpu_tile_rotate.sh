#!/usr/bin/env bash
# One device call (2 x H200, <= 300 s): the rotated m-fastest tile order (MEGAMOE_GEMM_M_FASTEST=1, branch tile-rotate,
# locate_tile_ordered NOTES) against the default n-fastest order, side by side; beside it on GPU 1 the W4A8 v8 decode
# script of branch w4a8-v8 (its own prebuilt). Carry one tgz with .xfer/pre-rotate, .xfer/pre-w4a8-v8, .xfer/w4a8-v8.
#   source scripts/use_prebuilt.sh rotate && OUT=$OUT bash scripts/gpu_tile_rotate.sh
# (1) GPU 0: GroupedGemmFp8.* and the mega rows tests with the switch on; (2) GPU 0: bench gemm fp8, 128 experts,
# multinomial rows at means 128 / 256 / 512 / 1024, dsv3 / ms4 / qwen3-30b, 0 / 1 alternating, two rounds; (3) both
# GPUs: bench layer fp8 staged + mega on 2 ranks, dsv3 2048 / 8192 (two rounds), ms4 / qwen3-30b (one round).
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh rotate first}; T=$B/tests
budget_s=${BUDGET_S:-300}; pack_name=tile_rotate.tgz
source scripts/device_steps.sh
if [ -d .xfer/pre-w4a8-v8 ]; then
  ( source scripts/use_prebuilt.sh w4a8-v8 .xfer/w4a8-v8 >/dev/null && CUDA_VISIBLE_DEVICES=1 PREBUILT=$PREBUILT \
      OUT=$out/v8 bash .xfer/w4a8-v8/scripts/gpu_w4a8_v8.sh > "$out/w4a8_v8.out" 2>&1 ) &
  v8_pid=$!
fi
export CUDA_VISIBLE_DEVICES=0
step test_gemm_m1 90 env MEGAMOE_GEMM_M_FASTEST=1 "$T/megamoe_tests_gpu" \
  --gtest_filter='GroupedGemmFp8.*:MegaSingle.*Rows*'
print_test_counts
for round in 1 2; do for mf in 0 1; do
  step "gemm_m${mf}_$round" 25 env MEGAMOE_GEMM_M_FASTEST=$mf "$B/megamoe" bench gemm --format fp8 \
    --models dsv3 ms4 qwen3-30b --rows 128 256 512 1024 --experts 128 --rows-spread multinomial --no-cublas \
    --repeats 10 --json "$logs/gemm_m${mf}_$round.json"
done; done
[ -n "${v8_pid:-}" ] && wait "$v8_pid"
unset CUDA_VISIBLE_DEVICES
for round in 1 2; do for mf in 0 1; do
  for model in dsv3 ms4 qwen3-30b; do
    [ "$round" = 2 ] && [ "$model" != dsv3 ] && continue
    step "layer_${model}_m${mf}_$round" 45 env MEGAMOE_GEMM_M_FASTEST=$mf "$B/megamoe" bench layer --backend staged,mega \
      --ranks 2 --preset "$model" --format fp8_block --tokens 2048,8192 --iters 6 --json "$logs/layer_${model}_m${mf}_$round.json"
  done
done; done
print_summary
[ -f "$out/w4a8_v8.out" ] && { echo "===== w4a8 v8 (GPU 1)"; tail -32 "$out/w4a8_v8.out"; }
python3 scripts/tile_order_table.py "$logs"
pack
