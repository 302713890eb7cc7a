#!/usr/bin/env bash
# One call on a GPU machine: build with all cores, run the gpu + multigpu tests, run the benchmarks,
# print a short table last. Logs and JSON go to $OUT (or out/) when set.
#   scripts/gpu_check.sh [build-dir]      env: BENCH=0 skips benchmarks, SANITIZE=1 adds memcheck
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-/tmp/build-megamoe}
out=${OUT:-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/nccl_env.sh
summary=()
step() {  # step NAME command...: runs, logs, records pass/fail and seconds
  local name=$1; shift; local t0=$(date +%s)
  if "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL|$(( $(date +%s) - t0 ))s"); tail -40 "$out/$name.log"; fi
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader | tee "$out/gpus.txt"
step build scripts/build.sh "$build" -DNCCL_ROOT="$MEGAMOE_NCCL_ROOT" -DMEGAMOE_BUILD_TESTS=ON
step test_gpu ctest --test-dir "$build" -L gpu --output-on-failure --timeout 300
step test_multigpu ctest --test-dir "$build" -L multigpu --output-on-failure --timeout 300
if [ "${SANITIZE:-0}" = 1 ] && [ -x "$build/tests/megamoe_tests_gpu" ]; then
  step memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/megamoe_tests_gpu" \
       --gtest_filter="${SANITIZE_FILTER:-*Small*}"
fi
if [ "${BENCH:-1}" = 1 ]; then
  step bench_gemm "$build/megamoe" bench gemm --json "$out/bench_gemm.json" ${BENCH_GEMM_ARGS:-}
  step bench_layer "$build/megamoe" bench layer --json "$out/bench_layer.json" ${BENCH_LAYER_ARGS:---preset dsv3 --format fp8 --backend staged --ranks 2 --tokens 128,8192}
fi
for log in "$out"/bench_*.log; do [ -f "$log" ] && { echo "== $log"; tail -25 "$log"; }; done
grep -h -E "tests passed|tests failed|Passed|Failed|Skipped" "$out"/test_*.log 2>/dev/null | tail -20
printf '\n%-16s %-6s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-16s %-6s %s\n' "$a" "$b" "$c"; done
