#!/usr/bin/env bash
# One device call (one H200, <= 220 s, prebuilt w4a8-v10): W4A8 v10, the 128 x 128 BF16-out kernel on v11's skeleton
# (docs/grouped_gemm.md "W4A8 v10", src/kernels/sm90_w4a8_v10_grouped_gemm.cuh; MEGAMOE_W4A8_V10=0|1|2, default 0;
# 1: decoded-tile handoff by a 256-thread named barrier, 2: by mbarriers).
# Everything (step logs, bench JSONs) is packed into ONE file, $OUT/w4a8_v10.tgz, after every step.
# (1) GroupedGemmW4a8.W4a8V10MatchesDefaultBitForBit (v10=1 vs the default kernels byte for byte: 72 launch pairs,
#     both formats, decoders old / v8 / auto, hints 0 / 65 / 1024, N 256 / 7168 / 2048, K up to 7168, experts of
#     0-1000 rows, a 50-row buffer), W4a8V10HandoffMatchesDefaultBitForBit (v10=2, the same cases at hints 0 / 1024:
#     48 pairs) and W4a8V10AgainstReference (v10=1 and 2 pinned, fp64 reference, random + exact inputs).
# (2) bench gemm --gemms 2 --format nvfp4 / mxfp4, dsv3 ms4 qwen3-30b, 32 experts, exact 1024 / 4096 rows and
#     multinomial 512 / 1024, MEGAMOE_W4A8_V10=0 / 1 / 2 in alternating processes (read once per process); round 1,
# (3) compute-sanitizer memcheck and synccheck of W4a8V10AgainstReference, then bench round 2.
# (4) the table, last: TFLOP/s default / v10=1 / v10=2 and each / default (> 1: faster), best of the rounds.
# Expected: (1) ~25-60 s, 12 bench processes of ~3-5 s per round, memcheck / synccheck ~20-35 s each: round 1 and the
# sanitizers end by ~170-200 s; the 215 s budget cuts bench round 2 (partly or wholly) first.
#   source scripts/use_prebuilt.sh w4a8-v10 .xfer/w4a8-v10 && \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/w4a8-v10/scripts/gpu_w4a8_v10.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh w4a8-v10 .xfer/w4a8-v10 first}
budget_s=${BUDGET_S:-215}; pack_name=w4a8_v10.tgz
source "$(dirname "$0")/device_steps.sh"
T="$B/tests/megamoe_tests_gpu"
step gtest_v10 80 "$T" --gtest_filter='GroupedGemmW4a8.W4a8V10*'
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]|vs default' "$logs/gtest_v10.log"
bench_round() {
  local round=$1 format v10 spread rows
  for format in nvfp4 mxfp4; do
    for v10 in 0 1 2; do
      for spread in none multinomial; do
        rows="1024 4096"; [ "$spread" = multinomial ] && rows="512 1024"
        # shellcheck disable=SC2086
        step "bench_${format}_v${v10}_${spread}_$round" 15 env MEGAMOE_W4A8_V10=$v10 MEGAMOE_W4A8_V9=0 "$B/megamoe" \
          bench gemm --gemms 2 --format "$format" --models dsv3 ms4 qwen3-30b --rows $rows --rows-spread "$spread" \
          --no-cublas --repeats 10 --json "$logs/bench_${format}_v${v10}_${spread}_$round.json"
      done
    done
  done
}
bench_round 1
for tool in memcheck synccheck; do
  step "$tool" 35 compute-sanitizer --tool "$tool" --report-api-errors no --error-exitcode 1 "$T" \
    --gtest_filter='GroupedGemmW4a8.W4a8V10AgainstReference'
  grep -hE 'ERROR SUMMARY|^\[  (PASSED|FAILED) ' "$logs/$tool.log"
done
bench_round 2
pack
print_summary
python3 "$(dirname "$0")/bench_variant_table.py" "$logs" v10
