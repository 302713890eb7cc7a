#!/usr/bin/env bash
# One GPU call for the BF16 grouped GEMM: build + `*Bf16*` and FP8 GEMM tests + the staged backend tests
# (EpSingle, which run staged with bf16 weights), a compute-sanitizer memcheck of the BF16 tests, and
# `megamoe bench gemm --format bf16`; logs + JSON in $OUT, table last. Wraps scripts/gpu_gemm.sh.
#   env: BENCH_GEMM_ARGS (default: the 5 models, 8..4096 rows), SKIP_BENCH=1, BUILD_DIR
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}; mkdir -p "$out"
build=${BUILD_DIR:-/tmp/build-bf16gemm}
TEST_FILTER='*Bf16*:GroupedGemmFp8.*:EpSingle.*' SKIP_SANITIZER=1 BUILD_DIR="$build" \
  BENCH_GEMM_ARGS="--format bf16 ${BENCH_GEMM_ARGS:-}" bash scripts/gpu_gemm.sh
echo "== memcheck (BF16 GEMM tests)"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/megamoe_tests_gpu" \
  --gtest_filter='GroupedGemmBf16.PlainSplitNSmallGroups:GroupedGemmBf16.Gemm1SiluTopk:GroupedGemmBf16.PlainSplitMRandomShapes' \
  >"$out/memcheck_bf16.log" 2>&1 && echo "memcheck_bf16 ok" || { echo "memcheck_bf16 FAIL"; tail -30 "$out/memcheck_bf16.log"; }
