#!/usr/bin/env bash
# One device call (2 x H200, prebuilt binaries): the staged layer's GEMM tile choice, side by side.
#   source scripts/use_prebuilt.sh NAME && OUT=$OUT bash scripts/gpu_staged_tiles.sh
# bench layer (staged) with MEGAMOE_STAGED_ROWS_HINT=auto (the computed hint, opt-in), then forced to 32 (64-row
# tiles), 256 (mid) and 0 (unknown: the largest tiles, the behaviour before session 7); PRESETS, TOKENS.
# Then (NCU=1) an ncu summary of the FP8 GEMMs at 128 experts x ROWS_NCU rows (dsv3), and (TESTS=1)
# GroupedGemmFp8.* + StagedPhaseTiming + EpSingle and a memcheck of the GEMM-1 bulk-store tests.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; B=${PREBUILT:?source scripts/use_prebuilt.sh first}
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout "$limit" "$@" >"$out/$name.log" 2>&1
         local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; return $rc; }
step smoke 40 "$B/tests/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.PlainSplitNSmallGroups:StagedPhaseTiming.*' || exit 1
for preset in ${PRESETS:-dsv3 qwen3-30b}; do
  for hint in auto ${HINTS:-32 256 0}; do
    env=(MEGAMOE_STAGED_ROWS_HINT=$hint)
    step "layer_${preset}_$hint" 150 env "${env[@]}" "$B/megamoe" bench layer --backend staged --ranks 2 \
      --preset "$preset" --format "${FORMAT:-fp8_block}" --tokens "${TOKENS:-128,2048,8192}" --iters 10 \
      --json "$out/layer_${preset}_$hint.json"
    grep -E "^\| staged" "$out/layer_${preset}_$hint.log" | awk -v h="$hint" -F'|' '{print h, $3, $5, $13}'
  done
done
if [ "${NCU:-1}" = 1 ]; then
  step ncu 150 ncu --clock-control none -k regex:sm90_fp8_grouped_gemm_kernel -c 4 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats \
    "$B/megamoe" bench gemm --models dsv3 --experts 128 --rows ${ROWS_NCU:-8 128} --repeats 1 --no-cublas
  grep -E "sm90_fp8|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Compute \(SM\)|Stall|Warp Cycles" "$out/ncu.log" | head -60
fi
if [ "${TESTS:-1}" = 1 ]; then
  step tests 240 "$B/tests/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.*:StagedPhaseTiming.*:EpSingle.*'
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$out/tests.log"
  step memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 1 "$B/tests/megamoe_tests_gpu" \
    --gtest_filter='GroupedGemmFp8.Gemm1ExactInputsMatchDeviceArithmetic:GroupedGemmFp8.Gemm1SiluTopk:GroupedGemmFp8.PlainBulkStoreManyTilesPerCta'
  grep -E "ERROR SUMMARY" "$out/memcheck.log"
fi
(cd "$out" && tar czf logs.tgz ./*.log && rm -f ./*.log)
