#!/usr/bin/env bash
# One call on a GPU machine: build with all cores, run the gpu + multigpu tests, a compute-sanitizer
# memcheck on small tests, and the benchmarks; print a short table last. Logs + JSON go to $OUT
# (or out/).   scripts/gpu_check.sh [build-dir]
#   env: BENCH=0 skips benchmarks, GEMM_BENCH=0 skips the GEMM ones, SANITIZE=0 skips memcheck,
#        QUICK=1 runs fewer benchmark points, TEST_FILTER=regex limits the gpu tests, TESTS=0 skips
#        the tests (a second call on a warm machine: benchmarks only, the build is incremental),
#        MULTIGPU=0 skips the 2-GPU tests, BENCHES="bench_gemm bench_layer ..." runs only those benchmarks,
#        PREBUILT=dir uses binaries from scripts/prebuild.sh (set by `source scripts/use_prebuilt.sh NAME`;
#        GTEST_FILTER then limits the gpu tests)
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-/tmp/build-megamoe}
out=${OUT:-out}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
source scripts/nccl_env.sh
source scripts/cudnn_env.sh  # cuDNN attention needs .deps/cudnn-frontend too (install_deps.sh here, carried)
summary=()
step() {  # step NAME TIMEOUT command...: runs, logs, records pass/fail and seconds
  local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  [[ $name != bench_* || -z ${BENCHES:-} || " $BENCHES " == *" $name "* ]] || return 0
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($?)|$(( $(date +%s) - t0 ))s"); tail -30 "$out/$name.log"; fi
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpus.txt"
if [ -n "${PREBUILT:-}" ]; then  # binaries from scripts/prebuild.sh (source scripts/use_prebuilt.sh first)
  build=$PREBUILT; summary+=("build|prebuilt|0s")
else
  step build 400 scripts/build.sh "$build" -DNCCL_ROOT="$MEGAMOE_NCCL_ROOT" -DCUDNN_ROOT="${CUDNN_ROOT:-}"
fi
cli="$build/megamoe"
if [ "${TESTS:-1}" = 1 ]; then
  if [ -n "${PREBUILT:-}" ]; then  # no ctest files there: the binaries, GTEST_FILTER instead of TEST_FILTER
    # One gtest shard per visible GPU, in parallel (the one-GPU suite is ~8 min serial, mostly host
    # references and the many-tiles cases); each shard's log is appended to test_gpu.log.
    step test_gpu "$(( ${TEST_GPU_LIMIT:-400} + 20 ))" bash -c 'n=$(nvidia-smi -L | wc -l); pids=(); rc=0
      for i in $(seq 0 $((n - 1))); do
        CUDA_VISIBLE_DEVICES=$i GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i timeout "$3" "$0" ${1:+--gtest_filter="$1"} >"$2.$i" 2>&1 &
        pids+=($!); done
      for p in "${pids[@]}"; do wait "$p" || rc=1; done; cat "$2".*; exit $rc' \
      "$build/tests/megamoe_tests_gpu" "${GTEST_FILTER:-}" "$out/test_gpu_shard" "${TEST_GPU_LIMIT:-400}"
    [ "${MULTIGPU:-1}" = 1 ] && step test_multigpu "${TEST_MULTIGPU_LIMIT:-300}" "$build/tests/megamoe_tests_multigpu"
  else
    step test_gpu 300 ctest --test-dir "$build" -L gpu ${TEST_FILTER:+-R "$TEST_FILTER"} --output-on-failure --timeout 120
    [ "${MULTIGPU:-1}" = 1 ] && step test_multigpu 240 ctest --test-dir "$build" -L multigpu --output-on-failure --timeout 120
  fi
fi
if [ "${SANITIZE:-1}" = 1 ] && [ "${TESTS:-1}" = 1 ]; then
  step memcheck 180 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$build/tests/megamoe_tests_gpu" \
       --gtest_filter="${SANITIZE_FILTER:-GroupedGemmFp8.PlainSplitNSmallGroups:RouterCuda.*:*Bf16*Small*:GroupedGemmW4a8.PlainRandomShapes}"
  # mega (issue #5: memcheck and racecheck clean at a small shape on one GPU): the persistent kernel's
  # spin waits make racecheck slow, so few cases: one rank, and the FP8 routing suite on 2 in-process ranks
  # (session 24's racecheck finding showed only there; MEGAMOE_LOOPBACK_CHILD=1 keeps it in this process,
  # with the child's environment; --report-api-errors no: the NCCL / cuBLAS probes' API return codes are not kernel errors).
  step mega_sanitize 240 bash -c 'for tool in memcheck racecheck; do MEGAMOE_LOOPBACK_CHILD=1 CUDA_MODULE_LOADING=EAGER \
       CUDA_DEVICE_MAX_CONNECTIONS=32 MEGAMOE_EP_TIMEOUT_MS=120000 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 1 \
       "$0" --gtest_filter="$1" || exit 1; done' "$build/tests/megamoe_tests_gpu" \
       "${MEGA_SANITIZE_FILTER:-MegaSingle.ZeroTokensAndChangingTokenCounts/fp8_block:Ranks/EpLoopback.MegaMatchesReferenceOnEveryRouting/2ranks}"
  # The v5 schedules' named barriers: races show up here, not in memcheck (small tests, each schedule).
  step synccheck 200 bash -c 'for schedule in pingpong overlap; do MEGAMOE_FP8_GEMM_SCHEDULE=$schedule \
       compute-sanitizer --tool synccheck --error-exitcode 1 "$0" --gtest_filter="$1" || exit 1; done' \
       "$build/tests/megamoe_tests_gpu" "${SYNCCHECK_FILTER:-GroupedGemmFp8.PlainSplitNSmallGroups:GroupedGemmFp8.Gemm1SwigluClampedNoTopk}"
fi
if [ "${BENCH:-1}" = 1 ]; then
  rows="1024 4096"; [ "${QUICK:-0}" = 1 ] || rows="32 128 1024 4096"
  if [ "${GEMM_BENCH:-1}" = 1 ]; then
  # shellcheck disable=SC2086
  step bench_gemm 150 "$cli" bench gemm --schedule all --models dsv3 ms4 qwen3-30b --rows $rows --json "$out/bench_gemm.json"
  # shellcheck disable=SC2086
  step bench_gemm_bf16 120 "$cli" bench gemm --format bf16 --models dsv3 qwen3-30b --rows $rows --json "$out/bench_gemm_bf16.json"
  # shellcheck disable=SC2086
  step bench_gemm_w4a8 120 bash -c "'$cli' bench gemm --format nvfp4 --models dsv3 qwen3-30b --rows $rows --json '$out/bench_gemm_nvfp4.json' &&
       '$cli' bench gemm --format mxfp4 --models dsv3 qwen3-30b --rows $rows --json '$out/bench_gemm_mxfp4.json'"
  fi
  step bench_ep 90 "$cli" bench ep --ranks 2 --tokens 4096 --hidden 7168 --top-k 8 --experts 256 --iters 20 \
       --json "$out/bench_ep_4096.json"
  step bench_layer 200 "$cli" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format fp8_block \
       --tokens 128,2048,8192 --iters 10 --json "$out/bench_layer_dsv3.json"
  step bench_layer_models 150 bash -c "'$cli' bench layer --backend staged,mega --ranks 2 --preset ms4 --format fp8_block \
       --tokens 128,2048,8192 --iters 10 --json '$out/bench_layer_ms4.json' && '$cli' bench layer --backend staged,mega \
       --ranks 2 --preset qwen3-30b --format fp8_block --tokens 128,2048,8192 --iters 10 --json '$out/bench_layer_qwen3.json'"
  step bench_layer_w4a8 300 bash -c "'$cli' bench layer --backend staged,mega --ranks 2 --preset dsv3 --format nvfp4 \
       --tokens 128,8192 --iters 5 --json '$out/bench_layer_nvfp4.json' && '$cli' bench layer --backend staged,mega \
       --ranks 2 --preset dsv3 --format mxfp4 --tokens 128,8192 --iters 5 --json '$out/bench_layer_mxfp4.json'"
  step bench_attention 90 bash -c "'$cli' bench attention --seq-lens 4096 --heads 32 --kv-heads 4 --head-dim 128 \
       --json '$out/bench_attention.json' && '$cli' bench attention --decode --seq-lens 4096 4096 4096 4096 \
       --heads 32 --kv-heads 4 --head-dim 128 --json '$out/bench_attention_decode.json'"
  step bench_layer_bf16 120 "$cli" bench layer --backend reference,staged --check --preset qwen3-30b --format bf16 \
       --tokens 32 --iters 3 --json "$out/bench_layer_bf16.json"
fi
for name in bench_gemm bench_gemm_bf16 bench_gemm_w4a8 bench_ep bench_layer bench_layer_models bench_layer_w4a8 bench_layer_bf16 bench_attention; do
  [ -f "$out/$name.log" ] && { echo "== $name"; tail -n 24 "$out/$name.log"; }
done
grep -h -E "tests passed|tests failed|^\[  (PASSED|FAILED)  \]" "$out"/test_*.log 2>/dev/null
grep -h -E "ERROR SUMMARY" "$out"/memcheck.log "$out"/synccheck.log "$out"/mega_sanitize.log 2>/dev/null
printf '\n%-14s %-9s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-14s %-9s %s\n' "$a" "$b" "$c"; done
