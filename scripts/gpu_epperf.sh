#!/usr/bin/env bash
# GPU machine, one call, prebuilt binaries (built on the CPU machine against NCCL 2.28.9 headers) in
# prebuilt/: EP tests (1 and 2 GPUs), memcheck of the 1-GPU dispatch/combine test, EP benchmarks.
# Logs to $OUT. Table last.   usage: bash scripts/gpu_epperf.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out-epperf}; mkdir -p "$OUT"
wheel=$(python3 -c "import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null || true)
[ -n "$wheel" ] && [ -e "$wheel/lib/libnccl.so.2" ] && export MEGAMOE_NCCL_ROOT=$wheel
source scripts/nccl_env.sh
export NCCL_NVLS_ENABLE=0
P=$(pwd)/prebuilt; export LD_LIBRARY_PATH="$P:$LD_LIBRARY_PATH"
chmod +x "$P"/* 2>/dev/null
start=$(date +%s)
lap() { echo "[$(( $(date +%s) - start )) s] $*"; }
timeout 60 "$P/megamoe_tests_gpu" --gtest_filter='EpSingle.*' >"$OUT/gpu_tests.log" 2>&1; g=$?; lap "gpu tests rc=$g"
timeout 120 "$P/megamoe_tests_multigpu" --gtest_filter='EpMulti.*' >"$OUT/multigpu_tests.log" 2>&1; m=$?; lap "multigpu tests rc=$m"
timeout 40 "$P/megamoe" bench ep --ranks 2 --tokens 4096 --hidden 7168 --top-k 8 --experts 256 --iters 20 \
  --json "$OUT/bench_ep_4096.json" >"$OUT/bench_ep_4096.log" 2>&1; b1=$?; lap "bench ep 4096 rc=$b1"
timeout 40 "$P/megamoe" bench ep --ranks 2 --tokens 8192 --hidden 7168 --top-k 8 --experts 256 --iters 10 \
  --json "$OUT/bench_ep_8192.json" >"$OUT/bench_ep_8192.log" 2>&1; b2=$?; lap "bench ep 8192 rc=$b2"
timeout 30 "$P/megamoe" bench layer --backend reference,staged --check --tokens 64 >"$OUT/bench_layer_check.log" 2>&1; b3=$?
lap "bench layer check rc=$b3"
timeout 100 "$P/megamoe" bench layer --backend staged --ranks 2 --preset dsv3 --format fp8_block --tokens 128,2048,8192 \
  --iters 10 --json "$OUT/bench_layer_dsv3.json" >"$OUT/bench_layer_dsv3.log" 2>&1; b4=$?; lap "bench layer dsv3 rc=$b4"
if [ "${MEMCHECK:-1}" = 1 ]; then
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 1 "$P/megamoe_tests_gpu" \
    --gtest_filter='EpSingle.DispatchCombineBitExact' >"$OUT/memcheck.log" 2>&1; mc=$?; lap "memcheck rc=$mc"
fi
echo "==================== summary ===================="
grep -hE "^\[  FAILED|Failure|Expected|Which is|actual|rel_l2|error" "$OUT/gpu_tests.log" "$OUT/multigpu_tests.log" | head -30
grep -hE "^\[  PASSED|tests ran" "$OUT/gpu_tests.log" "$OUT/multigpu_tests.log"
grep -h "ERROR SUMMARY" "$OUT/memcheck.log" 2>/dev/null
tail -3 "$OUT/bench_layer_check.log"
tail -6 "$OUT/bench_layer_dsv3.log"
tail -3 "$OUT/bench_ep_4096.log"; tail -3 "$OUT/bench_ep_8192.log"
