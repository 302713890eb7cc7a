#!/usr/bin/env bash
# One device call (one H200, <= 280 s, prebuilt w4a8-v10): verification of W4A8 v10 as the default BF16-out kernel
# (docs/grouped_gemm.md "W4A8 v10", src/kernels/sm90_w4a8_v10_grouped_gemm.cuh; MEGAMOE_W4A8_V10=0|1, unset = 1:
# GEMM 2 / plain at rows hints > 64 or unknown; 0 = the old 128 x 256 / 64-row kernels).
# Everything (step logs, bench JSONs) is packed into ONE file, $OUT/w4a8_v10.tgz, after every step. Budget-ordered:
# (1) GroupedGemmW4a8.* (~70 s; W4a8V10MatchesDefaultBitForBit: v10 vs the old kernels byte for byte, 72 launch
#     pairs; W4a8V10AgainstReference; PlainRandomShapes / Gemm2DeepK / BitExactRepresentableInputs run both V10=0 and
#     1; the rest at the new default), limit 160 s (session 17 call 7 cut it at 110 s, 14 of 15 tests done).
# (2) EpSingle.StagedMatchesReference* (staged FP8 / BF16 / nvfp4 / mxfp4 layers: W4A8 GEMM 2 through the new
#     default) and MegaSingle.*/nvfp4, MegaSingle.*/mxfp4 (mega vs staged bit for bit, staged GEMM 2 on v10),
#     limit 70 s.
# (3) bench gemm --gemms 2 --format nvfp4 / mxfp4, dsv3 qwen3-30b, 32 experts, exact 128 / 256 rows and multinomial
#     128 / 256 (the rows v10 takes by its gate but not measured before), MEGAMOE_W4A8_V10=0 vs unset (the default)
#     in alternating processes (read once per process), 2 rounds, 15 s per process.
# (4) the table, last: TFLOP/s V10=0 / default and default / V10=0 (> 1: v10 faster), best of the rounds.
# Expected: (1) ~115 s, (2) ~20-50 s, (3) 16 processes of ~3-5 s; the 280 s budget cuts bench round 2 first.
#   source scripts/use_prebuilt.sh w4a8-v10 .xfer/w4a8-v10 && \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/w4a8-v10/scripts/gpu_w4a8_v10.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh w4a8-v10 .xfer/w4a8-v10 first}
budget_s=${BUDGET_S:-280}; pack_name=w4a8_v10.tgz
source "$(dirname "$0")/device_steps.sh"
T="$B/tests/megamoe_tests_gpu"
step test_w4a8 160 "$T" --gtest_filter='GroupedGemmW4a8.*'
step test_ep_mega 70 "$T" --gtest_filter='EpSingle.StagedMatchesReference*:MegaSingle.*/nvfp4:MegaSingle.*/mxfp4'
print_test_counts
grep -hE 'vs old kernels' "$logs/test_w4a8.log"
for round in 1 2; do
  for format in nvfp4 mxfp4; do
    for spread in none multinomial; do
      for v10 in 0 d; do  # d: MEGAMOE_W4A8_V10 unset (the default)
        step "bench_${format}_v${v10}_${spread}_$round" 15 env $([ "$v10" = 0 ] && echo MEGAMOE_W4A8_V10=0 ||
          echo -u MEGAMOE_W4A8_V10) "$B/megamoe" bench gemm --gemms 2 --format "$format" --models dsv3 qwen3-30b \
          --rows 128 256 --rows-spread "$spread" --no-cublas --repeats 10 \
          --json "$logs/bench_${format}_v${v10}_${spread}_$round.json"
      done
    done
  done
done
pack
print_summary
python3 "$(dirname "$0")/bench_variant_table.py" "$logs" default gemm2 V10=0
