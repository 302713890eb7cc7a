#!/usr/bin/env bash
# One GPU call for the FP8-block grouped GEMM v5 schedules (docs/grouped_gemm.md, "v5, unmeasured"):
# build (all cores) into $BUILD_DIR (/tmp/build-pingpong), the FP8 GEMM GPU tests (every schedule,
# every tile config; pingpong bit-identical to serial) + the mega tests on one GPU (mega keeps the serial
# path), compute-sanitizer memcheck and synccheck (named-barrier hand-offs) on the schedule tests, then
# `megamoe bench gemm --schedule all` (serial, pingpong, overlap timed back to back per point, cuBLASLt
# FP8 in the same run) on dsv3, ms4, qwen3-30b at 128/1024/4096 rows per expert. Logs + JSON in $OUT;
# a short table last.
#   env: SKIP_TESTS=1, SKIP_SANITIZER=1, SKIP_BENCH=1, ROWS="128 1024 4096", MODELS="dsv3 ms4 qwen3-30b",
#        REPEATS=10, BENCH_GEMM_ARGS (extra bench args)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-/tmp/build-pingpong}
out=${OUT:-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
source scripts/nccl_env.sh
summary=()
step() {  # step NAME TIMEOUT command...
  local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($?)|$(( $(date +%s) - t0 ))s"); tail -40 "$out/$name.log"; fi
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpus.txt" | head -1
# Same stubs as scripts/gpu_gemm.sh: the GPU machine lacks pcre2 / cpp-httplib dev packages that only
# the engine/server need.
extra=()
if ! pkg-config --exists libpcre2-8 2>/dev/null; then
  mkdir -p /tmp/gemm-pc && printf 'Name: libpcre2-8\nDescription: stub\nVersion: 10.42\nLibs: -l:libpcre2-8.so.0\nCflags:\n' >/tmp/gemm-pc/libpcre2-8.pc
  export PKG_CONFIG_PATH=/tmp/gemm-pc:${PKG_CONFIG_PATH:-}
fi
[ -f /usr/include/httplib.h ] || extra+=(-DHTTPLIB_INCLUDE_DIR=/tmp/gemm-pc)
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
step configure 120 cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$MEGAMOE_NCCL_ROOT" "${extra[@]}"
step build 400 cmake --build "$build" -j "$(nproc)" --target megamoe_tests_gpu megamoe_cli
grep -hE "C7514|C7518|spill" "$out/build.log" | grep -E "fp8_grouped_gemm|mega_moe" | sort -u | head -20
tests="$build/tests/megamoe_tests_gpu"
[ -x "$tests" ] || tests="$build/megamoe_tests_gpu"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  step test_gemm 240 "$tests" --gtest_filter='GroupedGemmFp8.*'
  step test_mega 150 "$tests" --gtest_filter='MegaSingle.*'
  grep -hE "rel-L2|code flips" "$out/test_gemm.log" | sort | uniq -c | sort -rn | head -12
fi
if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  filter='GroupedGemmFp8.ScheduleVariantsPlainAllTiles:GroupedGemmFp8.ScheduleVariantsGemm1AllTiles'
  step memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 1 "$tests" --gtest_filter="$filter"
  step synccheck 300 compute-sanitizer --tool synccheck --error-exitcode 1 "$tests" --gtest_filter="$filter"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  # shellcheck disable=SC2086
  step bench_gemm 400 "$build/megamoe" bench gemm --schedule all --models ${MODELS:-dsv3 ms4 qwen3-30b} \
       --rows ${ROWS:-128 1024 4096} --repeats "${REPEATS:-10}" --json "$out/bench_gemm_pingpong.json" ${BENCH_GEMM_ARGS:-}
fi
grep -hE "^\[  (FAILED|PASSED) |tests? ran" "$out"/test_*.log 2>/dev/null | head -20
grep -h "ERROR SUMMARY" "$out"/memcheck.log "$out"/synccheck.log 2>/dev/null
if [ -f "$out/bench_gemm_pingpong.json" ]; then
  python3 - "$out/bench_gemm_pingpong.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
print(f"\n{'model':10} {'rows':>5} {'gemm':5} | {'serial':>7} {'pingpong':>8} {'overlap':>7} | {'cuBLAS':>7} | {'best':8} {'x cuBLAS':>8}  (TFLOP/s)")
for r in rows:
    v = {"serial": r["tflops"], "pingpong": r.get("pingpong_tflops", 0.0), "overlap": r.get("overlap_tflops", 0.0)}
    best = max(v, key=v.get)
    ratio = v[best] / r["cublas_fp8_tflops"] if r.get("cublas_fp8_tflops") else 0.0
    print(f"{r['model']:10} {r['rows_per_expert']:5d} {r['gemm']:5} | {v['serial']:7.0f} {v['pingpong']:8.0f} "
          f"{v['overlap']:7.0f} | {r.get('cublas_fp8_tflops', 0):7.0f} | {best:8} {ratio:8.2f}")
EOF
fi
printf '\n%-12s %-9s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-12s %-9s %s\n' "$a" "$b" "$c"; done
