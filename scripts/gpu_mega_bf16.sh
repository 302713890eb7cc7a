#!/usr/bin/env bash
# One device call for mega with BF16 weights, binaries compiled HERE (scripts/prebuild.sh) and carried:
#   source scripts/use_prebuilt.sh NAME SOURCE-TREE && cd SOURCE-TREE && bash scripts/gpu_mega_bf16.sh
# Runs the mega tests (both formats, 1 and 2 GPUs), the refactored BF16 grouped GEMM tests, the engine
# logits tests with mega BF16, the dsv3 BF16 layer benchmark (staged vs mega, same run, --check) and a
# memcheck of a small mega BF16 test; prints a short table last. Logs + JSON in $OUT.
#   env: TOKENS=128,2048, BENCH=0 / SANITIZE=0 / ENGINE=0 skip those steps, GEMM=1 adds the standalone
#        BF16 grouped GEMM benchmark (dsv3, 1024 rows per expert), GPU_FILTER / MULTI_FILTER: test filters
set -uo pipefail
bin=${PREBUILT:?source scripts/use_prebuilt.sh first}
out=${OUT:-out}; mkdir -p "$out"
summary=()
step() {  # step NAME TIMEOUT command...: runs, logs, records pass/fail and seconds
  local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($?)|$(( $(date +%s) - t0 ))s"); tail -25 "$out/$name.log"; fi
}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$out/gpus.txt"
step test_gpu 70 "$bin/tests/megamoe_tests_gpu" --gtest_filter="${GPU_FILTER:-MegaSingle.*:GroupedGemmBf16.*}"
step test_multigpu 80 "$bin/tests/megamoe_tests_multigpu" --gtest_filter="${MULTI_FILTER:-MegaMulti.*}"
[ "${BENCH:-1}" = 1 ] && step bench_layer 90 "$bin/megamoe" bench layer --backend staged,mega --ranks 2 --preset dsv3 \
  --format bf16 --tokens "${TOKENS:-128,2048}" --iters 10 --check --check-tokens 4 --json "$out/bench_layer_dsv3_bf16_mega.json"
[ "${GEMM:-0}" = 1 ] && step bench_gemm 60 "$bin/megamoe" bench gemm --format bf16 --models dsv3 --rows 1024 --repeats 5 \
  --no-cublas --json "$out/bench_gemm_bf16_dsv3.json"
if [ "${ENGINE:-1}" = 1 ]; then
  step engine_gpu 50 "$bin/tests/megamoe_tests_gpu" --gtest_filter='*GpuStaged*mega*:*GpuStaged*staged_bf16'
  step engine_dp 80 "$bin/tests/megamoe_tests_multigpu" --gtest_filter='GpuGenerate.DataParallel2LogitsMatchCpuReference'
fi
[ "${SANITIZE:-1}" = 1 ] && step memcheck 60 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 \
  "$bin/tests/megamoe_tests_gpu" --gtest_filter='MegaSingle.ZeroTokensAndChangingTokenCounts/bf16'
grep -h -E "^\[(mega|staged)|^\[  (FAILED|PASSED) |^\[.*rank . row 0\]" "$out"/test_*.log "$out"/engine_*.log 2>/dev/null | head -70
grep -h -E "ERROR SUMMARY" "$out"/memcheck.log 2>/dev/null
[ -f "$out/bench_layer.log" ] && { echo "== bench_layer"; tail -n 8 "$out/bench_layer.log"; }
[ -f "$out/bench_gemm.log" ] && { echo "== bench_gemm"; tail -n 8 "$out/bench_gemm.log"; }
printf '\n%-14s %-9s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-14s %-9s %s\n' "$a" "$b" "$c"; done
