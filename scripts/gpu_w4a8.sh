#!/usr/bin/env bash
# One GPU call for the W4A8 grouped GEMM work. Uses binaries prebuilt on the CPU machine (prebuilt/,
# shipped with the working tree) when they load here, else builds into /tmp/build-w4a8. Runs the W4A8 +
# FP8 GEMM GPU tests and the staged single-rank test, a memcheck of one W4A8 test, and
# `megamoe bench gemm` for nvfp4 / mxfp4 (and fp8 at small M for the W4A8 / FP8 ratio); table last.
#   env: SKIP_SANITIZER=1, SKIP_BENCH=1, SKIP_FP8=1 (no FP8 bench), BENCH_MODELS, BENCH_ROWS, TEST_FILTER
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
source scripts/nccl_env.sh
summary=()
step() {
  local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($?)|$(( $(date +%s) - t0 ))s"); tail -40 "$out/$name.log"; fi
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | head -1
bin=prebuilt
export LD_LIBRARY_PATH="$PWD/prebuilt:$LD_LIBRARY_PATH"
if ! prebuilt/megamoe_tests_gpu --gtest_list_tests >/dev/null 2>&1 || ! prebuilt/megamoe bench gemm --help >/dev/null 2>&1; then
  ldd prebuilt/megamoe_tests_gpu 2>&1 | grep "not found"
  echo "prebuilt binaries do not load here: building"
  build=/tmp/build-w4a8
  extra=()
  if ! pkg-config --exists libpcre2-8 2>/dev/null; then
    mkdir -p /tmp/gemm-pc && printf 'Name: libpcre2-8\nDescription: stub\nVersion: 10.42\nLibs: -l:libpcre2-8.so.0\nCflags:\n' >/tmp/gemm-pc/libpcre2-8.pc
    export PKG_CONFIG_PATH=/tmp/gemm-pc:${PKG_CONFIG_PATH:-}
  fi
  [ -f /usr/include/httplib.h ] || extra+=(-DHTTPLIB_INCLUDE_DIR=/tmp/gemm-pc)
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  step configure 120 cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$MEGAMOE_NCCL_ROOT" "${extra[@]}"
  step build 400 cmake --build "$build" -j "$(nproc)" --target megamoe_tests_gpu megamoe_cli
  mkdir -p /tmp/bin-w4a8 && cp "$build/tests/megamoe_tests_gpu" "$build/megamoe" /tmp/bin-w4a8/ && bin=/tmp/bin-w4a8
fi
step test_gpu 90 "$bin/megamoe_tests_gpu" --gtest_filter="${TEST_FILTER:-*W4a8*:GroupedGemmFp8.*:EpSingle.StagedMatchesReference}"
grep -hE "rel-L2|code flips|\[staged\]|tests passed|PASSED|FAILED|Failure" "$out/test_gpu.log" | head -60
if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 1 "$bin/megamoe_tests_gpu" \
       --gtest_filter='GroupedGemmW4a8.PlainRandomShapes:GroupedGemmW4a8.Gemm1SwigluClampedNoTopk'
  grep -h "ERROR SUMMARY" "$out/memcheck.log"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  models=${BENCH_MODELS:-"dsv3 qwen3-30b"}; rows=${BENCH_ROWS:-"8 32 128 1024 4096"}
  # shellcheck disable=SC2086
  step bench_nvfp4 45 "$bin/megamoe" bench gemm --format nvfp4 --models $models --rows $rows --repeats 10 --json "$out/bench_gemm_nvfp4.json"
  # shellcheck disable=SC2086
  step bench_mxfp4 45 "$bin/megamoe" bench gemm --format mxfp4 --models $models --rows $rows --repeats 10 --json "$out/bench_gemm_mxfp4.json"
  [ "${SKIP_FP8:-0}" = 1 ] || step bench_fp8 30 "$bin/megamoe" bench gemm --format fp8 --models dsv3 --rows 8 32 1024 --repeats 10 --json "$out/bench_gemm_fp8.json"
  for f in nvfp4 mxfp4 fp8; do [ -f "$out/bench_$f.log" ] && { echo "== bench $f"; cat "$out/bench_$f.log"; }; done
fi
printf '\n%-12s %-9s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-12s %-9s %s\n' "$a" "$b" "$c"; done
