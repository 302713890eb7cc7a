#!/usr/bin/env bash
# GPU check of the CUDA routers: prebuilt test binary when it loads here, else a build. Logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp}
nvidia-smi -L
source scripts/nccl_env.sh  # libmegamoe links NCCL (unused by the routers); matching lib first
bin=prebuilt/megamoe_tests_gpu
export LD_LIBRARY_PATH=$PWD/prebuilt:${LD_LIBRARY_PATH:-}
if ! [ -x $bin ] || ! $bin --gtest_list_tests >/dev/null 2>&1; then
  $bin --gtest_list_tests 2>&1 | tail -3
  echo "prebuilt binary unusable here; building"
  cmake -S . -B /tmp/build-routergpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DNCCL_ROOT="$MEGAMOE_NCCL_ROOT" >"$out/cmake.log" 2>&1 &&
    cmake --build /tmp/build-routergpu -j"$(nproc)" --target megamoe_tests_gpu >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  bin=/tmp/build-routergpu/tests/megamoe_tests_gpu
fi
timeout 60 $bin --gtest_filter='RouterCuda*' 2>&1 | tee "$out/router_tests.log" | grep -v -E '^\[ +(RUN|OK) ' | tail -60
echo "== compute-sanitizer memcheck"
timeout 40 compute-sanitizer --tool memcheck $bin --gtest_filter='RouterCuda.MatchesReference*:RouterCuda.BadDevice*' >"$out/memcheck.log" 2>&1; echo "rc=$?"; tail -5 "$out/memcheck.log"
echo "== compute-sanitizer racecheck"
timeout 30 compute-sanitizer --tool racecheck $bin --gtest_filter='RouterCuda.ExactTies*' >"$out/racecheck.log" 2>&1; echo "rc=$?"; tail -5 "$out/racecheck.log"
