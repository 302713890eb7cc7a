#!/usr/bin/env bash
# One GPU call for the grouped-GEMM work: build (all cores) into /tmp/build-gemm, gpu tests, one
# compute-sanitizer memcheck on small tests, `megamoe bench gemm`; logs + JSON in $OUT; table last.
#   env: BENCH_GEMM_ARGS (extra bench args), SKIP_TESTS=1, SKIP_SANITIZER=1, SKIP_BENCH=1,
#        TEST_FILTER=<gtest filter> (runs the gpu test binary directly instead of ctest -L gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-/tmp/build-gemm}
out=${OUT:-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
source scripts/nccl_env.sh
summary=()
step() {
  local name=$1; shift; local t0=$(date +%s)
  if "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL|$(( $(date +%s) - t0 ))s"); tail -60 "$out/$name.log"; fi
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1
# The GPU machine lacks the pcre2 / cpp-httplib dev packages that CMakeLists.txt requires (only the
# engine/server use them, none of the targets built here): satisfy the lookups without them.
extra=()
if ! pkg-config --exists libpcre2-8 2>/dev/null; then
  mkdir -p /tmp/gemm-pc && printf 'Name: libpcre2-8\nDescription: stub\nVersion: 10.42\nLibs: -l:libpcre2-8.so.0\nCflags:\n' >/tmp/gemm-pc/libpcre2-8.pc
  export PKG_CONFIG_PATH=/tmp/gemm-pc:${PKG_CONFIG_PATH:-}
fi
[ -f /usr/include/httplib.h ] || extra+=(-DHTTPLIB_INCLUDE_DIR=/tmp/gemm-pc)
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
step configure cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$MEGAMOE_NCCL_ROOT" "${extra[@]}"
step build cmake --build "$build" -j "$(nproc)" --target megamoe_tests_gpu megamoe_cli
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  if [ -n "${TEST_FILTER:-}" ]; then
    step test_gpu timeout 240 "$build/tests/megamoe_tests_gpu" --gtest_filter="$TEST_FILTER"
  else
    step test_gpu timeout 240 ctest --test-dir "$build" -L gpu --output-on-failure --timeout 120 -V
  fi
  grep -hE "rel-L2|code flips" "$out/test_gpu.log" | sort | uniq | head -20
fi
if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  step memcheck timeout 240 compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/megamoe_tests_gpu" \
       --gtest_filter='GroupedGemmFp8.PlainSplitNSmallGroups:GroupedGemmFp8.Gemm1SiluTopk:GroupedGemmFp8.PlainSplitMRandomShapes'
  tail -3 "$out/memcheck.log"
fi
[ "${SKIP_BENCH:-0}" = 1 ] || step bench_gemm timeout 300 "$build/megamoe" bench gemm --json "$out/bench_gemm.json" ${BENCH_GEMM_ARGS:-}
grep -E "tests passed|tests failed|PASSED|FAILED" "$out"/test_gpu.log 2>/dev/null
[ -f "$out/bench_gemm.log" ] && { echo "== bench gemm"; tail -80 "$out/bench_gemm.log"; }
printf '\n%-12s %-6s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-12s %-6s %s\n' "$a" "$b" "$c"; done
