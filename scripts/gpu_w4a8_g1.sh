#!/usr/bin/env bash
# One device call (ONE H200, <= 300 s, prebuilt w4a8-g1): W4A8 v10 GEMM 1 (docs/grouped_gemm.md "W4A8 v10 GEMM 1",
# src/kernels/sm90_w4a8_v10_gemm1.cuh; MEGAMOE_W4A8_G1_V10=1 makes `megamoe bench gemm` pack W13 kGateUpInterleaved8,
# which runs the new kernel; 0 = kGateUp, the old GEMM-1 kernels). One binary: switch 0 vs 1 in alternating processes
# (the switch is read once per process). Everything is packed into ONE file, $OUT/w4a8_g1.tgz, after every step.
# Budget-ordered:
# (1) the two new tests first (limit 60 s): W4a8V10Gemm1MatchesOldBitForBit (new vs old kernels byte for byte, 96
#     launch pairs) and W4a8V10Gemm1AgainstReference (fp64 reference, kGateUpInterleaved8 packing).
# (2) bench gemm --gemms 1, nvfp4 and mxfp4, dsv3 ms4 qwen3-30b, 32 experts, exact 1024 / 4096 rows and multinomial
#     512, switch 0 vs 1 in alternating processes, round 1 (12 processes).
# (3) compute-sanitizer memcheck of GroupedGemmW4a8.W4a8V10Gemm1AgainstReference (limit 90 s).
# (4) the rest of GroupedGemmW4a8.* (limit 150 s; the switch changes nothing for them: they pack kGateUp / kDown
#     explicitly; RejectsBadInputs checks the GEMM-1 packing rule).
# (5) bench round 2 (what the budget leaves). (6) the table last: TFLOP/s old (switch 0), g1v10 (1), g1v10 / old.
#   source scripts/use_prebuilt.sh w4a8-g1 .xfer/w4a8-g1 && PREBUILT=$PREBUILT OUT=$OUT \
#     bash .xfer/w4a8-g1/scripts/gpu_w4a8_g1.sh
# (BASE_PREBUILT, if set, is not used: both sides run the branch's binary.)
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh w4a8-g1 first}
budget_s=${BUDGET_S:-300}; pack_name=w4a8_g1.tgz
source "$(dirname "$0")/device_steps.sh"
T="$B/tests/megamoe_tests_gpu"
step test_g1 60 "$T" --gtest_filter='GroupedGemmW4a8.W4a8V10Gemm1*'
grep -hE "^\[  FAILED  \]|launch pairs" "$logs/test_g1.log" | sort -u | head -20
bench_round() {
  local round=$1 format spread rows v
  for format in ${FORMATS:-nvfp4 mxfp4}; do
    for spread in none multinomial; do
      if [ "$spread" = none ]; then rows="1024 4096"; else rows=512; fi
      for v in 0 1; do
        step "bench_${format}_v${v}_${spread}_$round" 25 env MEGAMOE_W4A8_G1_V10=$v "$B/megamoe" bench gemm --gemms 1 \
          --format "$format" --models dsv3 ms4 qwen3-30b --rows $rows --rows-spread "$spread" --no-cublas --repeats 10 \
          --json "$logs/bench_${format}_v${v}_${spread}_$round.json"
      done
    done
  done
}
bench_round 1
step memcheck_g1 90 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$T" \
  --gtest_filter="${MEMCHECK_FILTER:-GroupedGemmW4a8.W4a8V10Gemm1AgainstReference}"
tail -3 "$logs/memcheck_g1.log"
step test_w4a8 150 "$T" --gtest_filter="${TEST_FILTER:-GroupedGemmW4a8.*:-GroupedGemmW4a8.W4a8V10Gemm1*}"
print_test_counts
grep -hE "^\[  FAILED  \]" "$logs"/test_*.log | sort -u | head -20
bench_round 2
pack
print_summary
python3 "$(dirname "$0")/bench_variant_table.py" "$logs" g1v10 gemm1 old
