#!/usr/bin/env bash
# GPU machine, one call, prebuilt binaries in prebuilt/ (built on the CPU machine against NCCL 2.28.9
# headers; third-party shared libraries the image may lack in prebuilt/fallback, searched last):
# EP tests (1 and 2 GPUs), EP benchmarks, memcheck of the 1-GPU dispatch/combine test. Logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out-epperf}; mkdir -p "$OUT"
wheel=$(python3 -c "import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null || true)
[ -n "$wheel" ] && [ -e "$wheel/lib/libnccl.so.2" ] && export MEGAMOE_NCCL_ROOT=$wheel
source scripts/nccl_env.sh
export NCCL_NVLS_ENABLE=0
P=$(pwd)/prebuilt
export LD_LIBRARY_PATH="$P:$LD_LIBRARY_PATH:/usr/local/cuda/lib64:$P/fallback"
chmod +x "$P"/megamoe* 2>/dev/null
ldd "$P/megamoe" | grep -E "not found|fallback|nccl|cublas" 
start=$(date +%s)
lap() { echo "[$(( $(date +%s) - start )) s] $*"; }
timeout 50 "$P/megamoe_tests_multigpu" --gtest_filter='EpMulti.*' >"$OUT/multigpu_tests.log" 2>&1; m=$?; lap "multigpu tests rc=$m"
timeout 25 "$P/megamoe_tests_gpu" --gtest_filter='EpSingle.*' >"$OUT/gpu_tests.log" 2>&1; g=$?; lap "gpu tests rc=$g"
grep -hE "^\[  FAILED|Failure|Expected|Which is|actual|error:|rel_l2" "$OUT/gpu_tests.log" "$OUT/multigpu_tests.log" | head -24
grep -hE "^\[  PASSED|tests ran" "$OUT/gpu_tests.log" "$OUT/multigpu_tests.log"
for T in 4096 128; do
  timeout 15 "$P/megamoe" bench ep --ranks 2 --tokens $T --hidden 7168 --top-k 8 --experts 256 --iters 20 \
    --json "$OUT/bench_ep_$T.json" >"$OUT/bench_ep_$T.log" 2>&1; lap "bench ep $T rc=$?"; tail -3 "$OUT/bench_ep_$T.log"
done
timeout 40 "$P/megamoe" bench layer --backend staged --ranks 2 --preset dsv3 --format fp8_block --tokens 128,2048,8192 \
  --iters 8 --json "$OUT/bench_layer_dsv3.json" >"$OUT/bench_layer_dsv3.log" 2>&1; lap "bench layer dsv3 rc=$?"
tail -7 "$OUT/bench_layer_dsv3.log"
timeout 15 "$P/megamoe" bench ep --ranks 2 --tokens 8192 --hidden 7168 --top-k 8 --experts 256 --iters 10 \
  --json "$OUT/bench_ep_8192.json" >"$OUT/bench_ep_8192.log" 2>&1; lap "bench ep 8192 rc=$?"; tail -3 "$OUT/bench_ep_8192.log"
if [ "${MEMCHECK:-1}" = 1 ]; then
  timeout 25 compute-sanitizer --tool memcheck --error-exitcode 1 "$P/megamoe_tests_gpu" \
    --gtest_filter='EpSingle.DispatchCombineBitExact' >"$OUT/memcheck.log" 2>&1; lap "memcheck rc=$?"
  grep -h "ERROR SUMMARY" "$OUT/memcheck.log"; grep -m3 -A6 "Invalid" "$OUT/memcheck.log"
fi
