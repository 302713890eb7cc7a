#!/usr/bin/env bash
# One device call (ONE H200, <= 300 s): the TMA-store FP8 rows epilogue of v11 GEMM 1's 128 x 256 tile
# (swiglu_quant_fp8_rows_epilogue kTmaStore; docs/grouped_gemm.md "v11 GEMM 1 TMA-store epilogue") against a
# baseline build of the per-row bulk copies. Two prebuilt trees: PREBUILT (the branch) and BASE_PREBUILT (its base:
# bf16-tma-store 8d5f6cc; `.xfer/pre-tma-store`, built from 31f0a59, has the same src/ and serves).
# Everything is packed into ONE file, $OUT/g1_tma.tgz, after every step. Budget-ordered:
# (1) the whole one-GPU suite of the branch (TEST_FILTER=...: only those gtests, <= 120 s); in GroupedGemmFp8.* every run_gemm1 case runs v11 GEMM 1 (128 x 256, cluster
#     off and on, TMA scales off and on) and requires v9's codes and scales bit for bit; experts of 0..300 rows, so
#     both the TMA-store warps (16 rows of the expert) and the per-row fallback (an expert's last rows) run.
# (2) bench gemm --gemms 1, fp8, v11 GEMM 1 128 x 256 in the main column (--gemm1-v9 on --gemm1-v11 on; small off),
#     dsv3 ms4 qwen3-30b, 32 experts, exact 1024 / 4096 rows and multinomial 512, base vs branch in alternating
#     processes, round 1.
# (3) compute-sanitizer memcheck of GroupedGemmFp8.Gemm1V11ManyTilesPerCta. (4) bench round 2 (what the budget
#     leaves). (5) the table last: GEMM-1 TFLOP/s base, branch, branch / base.
#   tar -xzf .xfer/callN.tgz && source scripts/use_prebuilt.sh base && BASE_PREBUILT=$PREBUILT && \
#     source scripts/use_prebuilt.sh NAME && BASE_PREBUILT=$BASE_PREBUILT PREBUILT=$PREBUILT OUT=$OUT \
#     bash scripts/gpu_g1_tma.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}
BASE=${BASE_PREBUILT:?the baseline build (scripts/use_prebuilt.sh of the base)}
budget_s=${BUDGET_S:-300}; pack_name=g1_tma.tgz
source "$(dirname "$0")/device_steps.sh"
T="$B/tests/megamoe_tests_gpu"
if [ -n "${TEST_FILTER:-}" ]; then
  step test_gpu_fp8 120 "$T" --gtest_filter="$TEST_FILTER"
else  # the whole one-GPU suite, both shards on GPU 0 (~190 s): also the staged / mega paths that run v11 GEMM 1
  SHARD_GPUS=${SHARD_GPUS:-0 0} step_sharded_gpu_suite test_gpu 240 "$T"
fi
print_test_counts
grep -h "^\[  SKIPPED \]\|^\[  FAILED  \]" "$logs"/test_gpu*.log | sort -u | head -20
bench_round() {
  local round=$1 spread rows v bin
  for spread in none multinomial; do
    if [ "$spread" = none ]; then rows="1024 4096"; else rows=512; fi
    for v in 0 1; do  # 0: the baseline build, 1: the branch
      if [ "$v" = 0 ]; then bin=$BASE/megamoe; else bin=$B/megamoe; fi
      step "bench_fp8_v${v}_${spread}_$round" 20 "$bin" bench gemm --gemms 1 --format fp8 --gemm1-v9 on \
        --gemm1-v11 on --models dsv3 ms4 qwen3-30b --rows $rows --rows-spread "$spread" --no-cublas --repeats 10 \
        --json "$logs/bench_fp8_v${v}_${spread}_$round.json"
    done
  done
}
bench_round 1
step memcheck_g1_tma 90 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$T" \
  --gtest_filter='GroupedGemmFp8.Gemm1V11ManyTilesPerCta'
tail -3 "$logs/memcheck_g1_tma.log"
bench_round 2
pack
print_summary
python3 "$(dirname "$0")/bench_variant_table.py" "$logs" g1tma gemm1 base
