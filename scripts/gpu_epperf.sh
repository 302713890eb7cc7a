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
bench_ep() {  # bench_ep TOKENS ITERS [json]: all runs append to one log (the tool returns <= 8 files)
  local json=(); [ "${3:-}" = json ] && json=(--json "$OUT/bench_ep_$1.json")
  timeout 15 "$P/megamoe" bench ep --ranks 2 --tokens "$1" --hidden 7168 --top-k 8 --experts 256 --iters "$2" \
    "${json[@]}" >"$OUT/bench_ep_one.log" 2>&1; lap "bench ep $1 rc=$?"
  cat "$OUT/bench_ep_one.log" >>"$OUT/bench_ep.log"; tail -3 "$OUT/bench_ep_one.log"; rm -f "$OUT/bench_ep_one.log"
}
bench_ep 4096 20 json
timeout 60 "$P/megamoe" bench layer --backend staged --ranks 2 --preset dsv3 --format fp8_block --tokens 128,2048,8192 \
  --iters 8 --json "$OUT/bench_layer_dsv3.json" >"$OUT/bench_layer_dsv3.log" 2>&1; lap "bench layer dsv3 rc=$?"
tail -7 "$OUT/bench_layer_dsv3.log"
bench_ep 8192 10 json
bench_ep 128 20
if [ "${MEMCHECK:-1}" = 1 ]; then
  timeout 25 compute-sanitizer --tool memcheck --error-exitcode 1 "$P/megamoe_tests_gpu" \
    --gtest_filter='EpSingle.DispatchCombineBitExact' >"$OUT/memcheck.log" 2>&1; lap "memcheck rc=$?"
  grep -h "ERROR SUMMARY" "$OUT/memcheck.log"; grep -m3 -A6 "Invalid" "$OUT/memcheck.log"
fi
