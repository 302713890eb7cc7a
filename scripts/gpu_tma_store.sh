#!/usr/bin/env bash
# One device call (ONE H200, <= 420 s): the TMA-store epilogues (store_bf16_epilogue_tma; docs/grouped_gemm.md
# "v11 TMA-store epilogue") against a baseline build of the previous epilogues. Knobs: FORMATS (default "fp8 nvfp4"),
# GEMMS (default 2; "1 2" for both), BENCH_ARGS (more `bench gemm` flags; FP8 GEMM 1 as the staged layer runs it:
# "--gemm1-v9 on --gemm1-v11 on"), TEST_FILTER (a gtest filter instead of the whole one-GPU suite), MEMCHECK_FILTER.
# Session 18 call 4 (the v11 GEMM 1 rows epilogue) ran it as: FORMATS=fp8 GEMMS=1 BENCH_ARGS="--gemm1-v9 on
# --gemm1-v11 on" MEMCHECK_FILTER=GroupedGemmFp8.Gemm1V11ManyTilesPerCta.
# Two prebuilt trees: PREBUILT (the branch) and BASE_PREBUILT (its base). Everything is packed into ONE file,
# $OUT/tma_store.tgz, after every step. Budget-ordered:
# (1) the whole one-GPU suite of the branch (both shards on GPU 0; ~185 s): v11 vs the older FP8 kernels and v10 vs the
#     old W4A8 kernels bit for bit, the fp64-reference tests, staged / mega single-rank paths that run v11 GEMM 2.
# (2) bench gemm --gemms 2, fp8 and nvfp4, dsv3 ms4 qwen3-30b, 32 experts, exact 1024 / 4096 rows and multinomial 512,
#     base vs branch in alternating processes, round 1 (~40 s).
# (3) compute-sanitizer memcheck of GroupedGemmFp8.V11MatchesPlainRandomShapes + GroupedGemmW4a8.W4a8V10AgainstReference.
# (4) bench round 2 (what the budget leaves). (5) the table last: TFLOP/s base, branch, branch / base.
#   tar -xzf .xfer/callN.tgz && source scripts/use_prebuilt.sh base && BASE_PREBUILT=$PREBUILT && \
#     source scripts/use_prebuilt.sh NAME && BASE_PREBUILT=$BASE_PREBUILT PREBUILT=$PREBUILT OUT=$OUT \
#     bash scripts/gpu_tma_store.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}
BASE=${BASE_PREBUILT:?the baseline build (scripts/use_prebuilt.sh of the base)}
budget_s=${BUDGET_S:-420}; pack_name=tma_store.tgz
source "$(dirname "$0")/device_steps.sh"
T="$B/tests/megamoe_tests_gpu"
if [ -n "${TEST_FILTER:-}" ]; then
  step test_gpu 150 "$T" --gtest_filter="$TEST_FILTER"
else
  SHARD_GPUS=${SHARD_GPUS:-0 0} step_sharded_gpu_suite test_gpu 240 "$T"
fi
print_test_counts
grep -h "^\[  SKIPPED \]\|^\[  FAILED  \]" "$logs"/test_gpu*.log | sort -u | head -20
bench_round() {
  local round=$1 format spread rows v bin
  for format in ${FORMATS:-fp8 nvfp4}; do
    for spread in none multinomial; do
      if [ "$spread" = none ]; then rows="1024 4096"; else rows=512; fi
      for v in 0 1; do  # 0: the baseline build, 1: the branch
        if [ "$v" = 0 ]; then bin=$BASE/megamoe; else bin=$B/megamoe; fi
        # shellcheck disable=SC2086
        step "bench_${format}_v${v}_${spread}_$round" 20 "$bin" bench gemm --gemms ${GEMMS:-2} --format "$format" \
          ${BENCH_ARGS:-} \
          --models dsv3 ms4 qwen3-30b --rows $rows --rows-spread "$spread" --no-cublas --repeats 10 \
          --json "$logs/bench_${format}_v${v}_${spread}_$round.json"
      done
    done
  done
}
bench_round 1
step memcheck_tma 120 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$T" \
  --gtest_filter="${MEMCHECK_FILTER:-GroupedGemmFp8.V11MatchesPlainRandomShapes:GroupedGemmW4a8.W4a8V10AgainstReference}"
tail -3 "$logs/memcheck_tma.log"
bench_round 2
pack
print_summary
for g in ${GEMMS:-2}; do python3 "$(dirname "$0")/bench_variant_table.py" "$logs" tma "gemm$g" base; done
