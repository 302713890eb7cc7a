#!/usr/bin/env bash
# One device call (one H200, <= 200 s, prebuilt w4a8-v9): W4A8 v9, the 256 x 128 M-split BF16-out kernel
# (docs/grouped_gemm.md "W4A8 v9", src/kernels/sm90_w4a8_m_split_grouped_gemm.cuh; MEGAMOE_W4A8_V9=0|1, default 0).
# (1) GroupedGemmW4a8.* with MEGAMOE_W4A8_V9=1 (every BF16-out test at rows hint 0 or >= 256 runs v9 against the fp64
#     reference; MSplitV9MatchesDefaultBitForBit: v9 vs the default kernels byte for byte, 48 launch pairs, both
#     formats, decoders old / v8 / auto, N 256 / 7168 / 2048, K up to 7168, experts of 0-1000 rows, a 50-row
#     buffer; DecodeV7 left out for time).
# (2) bench gemm --gemms 2 --format nvfp4 / mxfp4, dsv3 ms4 qwen3-30b, 32 experts, exact 1024 / 4096 rows and
#     multinomial 512 / 1024, default vs MEGAMOE_W4A8_V9=1 in alternating processes (read once per process), 2 rounds.
# (3) compute-sanitizer memcheck and synccheck of GroupedGemmW4a8.MSplitV9AgainstReference (small shapes), then the
#     BF16-out tests and MSplitV9AgainstReference (pins v9 itself) without the variable, with the time left.
# (4) the table, last: TFLOP/s default / v9 and v9/default (> 1: v9 faster), best of the rounds.
#   source scripts/use_prebuilt.sh w4a8-v9 .xfer/w4a8-v9 && \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/w4a8-v9/scripts/gpu_w4a8_v9.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh w4a8-v9 .xfer/w4a8-v9 first}
budget_s=195; pack_name=w4a8_v9.tgz
source "$(dirname "$0")/device_steps.sh"
T="$B/tests/megamoe_tests_gpu"
step gtest_v9_on 80 env MEGAMOE_W4A8_V9=1 "$T" \
  --gtest_filter='GroupedGemmW4a8.*:-GroupedGemmW4a8.DecodeV7MatchesOldBitForBit'
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]|v9 vs default' "$logs/gtest_v9_on.log"
for round in 1 2; do
  for format in nvfp4 mxfp4; do
    for v9 in 0 1; do
      for spread in none multinomial; do
        rows="1024 4096"; [ "$spread" = multinomial ] && rows="512 1024"
        # shellcheck disable=SC2086
        step "bench_${format}_v${v9}_${spread}_$round" 20 env MEGAMOE_W4A8_V9=$v9 "$B/megamoe" bench gemm \
          --gemms 2 --format "$format" --models dsv3 ms4 qwen3-30b --rows $rows --rows-spread "$spread" \
          --no-cublas --repeats 10 --json "$logs/bench_${format}_v${v9}_${spread}_$round.json"
      done
    done
  done
done
for tool in memcheck synccheck; do
  step "$tool" 25 compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 1 "$T" \
    --gtest_filter='GroupedGemmW4a8.MSplitV9AgainstReference'
  grep -hE 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$logs/$tool.log"
done
# The BF16-out tests whose kernel the variable changes, and the new ones (they pin v9), with the variable unset.
unset_filter=GroupedGemmW4a8.MSplitV9AgainstReference:GroupedGemmW4a8.PlainRandomShapes
unset_filter+=:GroupedGemmW4a8.Gemm2DeepK:GroupedGemmW4a8.BitExactRepresentableInputs
step gtest_v9_unset 25 "$T" --gtest_filter="$unset_filter"
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$logs/gtest_v9_unset.log" 2>/dev/null
print_summary
python3 "$(dirname "$0")/bench_variant_table.py" "$logs" v9
