#!/usr/bin/env bash
# One device call for the mega backend with binaries compiled HERE (sm_90a, NCCL 2.28.9 headers) and
# carried over: no build on the GPU machine. Runs the tests that cover what mega touches (mega, FP8
# grouped GEMM, EP runtime + staged, 1 and 2 GPUs), the dsv3 FP8 layer benchmark with staged and mega
# in the same run, and a memcheck of a small mega test; prints a short table last. Logs + JSON in $OUT.
#   scripts/gpu_mega.sh [dir with megamoe, libmegamoe.so, megamoe_tests_gpu, megamoe_tests_multigpu]
#   env: BENCH=0 skips the benchmark, TOKENS=128,2048,8192, SANITIZE=0 skips memcheck,
#        GPU_FILTER / MULTI_FILTER: gtest filters of the 1-GPU / 2-GPU test binaries, TESTS=0 skips them,
#        CHECK="--check --check-tokens 4" adds the reference check to the benchmark
set -uo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-prebuilt}")
out=${OUT:-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/nccl_env.sh
export LD_LIBRARY_PATH="$bin:$LD_LIBRARY_PATH"
summary=()
if [ -n "$(ldd "$bin/megamoe_tests_multigpu" "$bin/megamoe" 2>&1 | grep "not found")" ]; then  # fall back to a build here
  ldd "$bin/megamoe_tests_multigpu" "$bin/megamoe" | grep "not found"
  build=/tmp/build-mega
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGAMOE_BUILD_SERVER=OFF -DNCCL_ROOT="$MEGAMOE_NCCL_ROOT" \
    >"$out/configure.log" 2>&1 && cmake --build "$build" -j"$(nproc)" --target megamoe_cli megamoe_tests_gpu \
    megamoe_tests_multigpu >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
  bin=$build; mkdir -p "$bin/tests"; cp "$build"/tests/megamoe_tests_* "$bin/" 
  export LD_LIBRARY_PATH="$bin:$LD_LIBRARY_PATH"
fi
step() {  # step NAME TIMEOUT command...: runs, logs, records pass/fail and seconds
  local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($?)|$(( $(date +%s) - t0 ))s"); tail -40 "$out/$name.log"; fi
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpus.txt"
if [ "${TESTS:-1}" = 1 ]; then
step test_gpu 150 "$bin/megamoe_tests_gpu" --gtest_filter="${GPU_FILTER:-MegaSingle.*:GroupedGemmFp8.*:EpSingle.*}"
step test_multigpu 180 "$bin/megamoe_tests_multigpu" --gtest_filter="${MULTI_FILTER:-MegaMulti.*:EpMulti.*}"
fi
if [ "${BENCH:-1}" = 1 ]; then
  step bench_layer 200 "$bin/megamoe" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format fp8_block \
       --tokens "${TOKENS:-128,2048,8192}" --iters 10 ${CHECK:-} --json "$out/bench_layer_dsv3_mega.json"
fi
if [ "${SANITIZE:-1}" = 1 ]; then
  step memcheck 90 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$bin/megamoe_tests_gpu" \
       --gtest_filter='MegaSingle.ZeroTokensAndChangingTokenCounts/*'
fi
grep -h -E "^\[(mega|staged|mega vs staged)|^\[  (FAILED|PASSED) |tests? (ran|passed)" "$out"/test_*.log 2>/dev/null | head -60
grep -h -E "ERROR SUMMARY" "$out"/memcheck.log 2>/dev/null
[ -f "$out/bench_layer.log" ] && { echo "== bench_layer"; tail -n 12 "$out/bench_layer.log"; }
printf '\n%-14s %-9s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-14s %-9s %s\n' "$a" "$b" "$c"; done
