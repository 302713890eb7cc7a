#!/usr/bin/env bash
# One device call: A/B of two prebuilt builds (scripts/prebuild.sh) at the layer and GEMM level, side by side.
#   OUT=$OUT bash scripts/gpu_layer_ab.sh OLD NEW        (carry .xfer/pre-OLD and .xfer/pre-NEW)
# Steps: 1. smoke (NEW, 40 s); 2. TEST_FILTER of NEW's gpu tests (TESTS=0 skips); 3. bench layer OLD, NEW,
# OLD, NEW per preset (PRESETS, TOKENS, BACKENDS, FORMAT); 4. bench gemm OLD / NEW (GEMM_ROWS; GEMM=0 skips).
# NOTES: two builds made in the same build directory would share libmegamoe.so through their RUNPATH;
# each side runs with its own directory first on LD_LIBRARY_PATH (which RUNPATH does not override).
set -uo pipefail
old=${1:?usage: gpu_layer_ab.sh OLD NEW}; new=${2:?usage: gpu_layer_ab.sh OLD NEW}
out=${OUT:-out}; mkdir -p "$out"
source scripts/use_prebuilt.sh "$old" >/dev/null || exit 1; OLD_DIR=$PREBUILT
source scripts/use_prebuilt.sh "$new" >/dev/null || exit 1; NEW_DIR=$PREBUILT
[ "$OLD_DIR" != "$NEW_DIR" ] || { echo "OLD and NEW unpack to the same directory $OLD_DIR (edit one PATHS)"; exit 1; }
base_ld=$LD_LIBRARY_PATH
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout "$limit" "$@" >"$out/$name.log" 2>&1
         local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; return $rc; }
side() { local dir=${1}_DIR; echo env LD_LIBRARY_PATH="${!dir}:$base_ld" "${!dir}/megamoe"; }  # timeout runs no functions
tests=$NEW_DIR/tests/megamoe_tests_gpu
step smoke 40 env LD_LIBRARY_PATH="$NEW_DIR:$base_ld" "$tests" --gtest_filter="${SMOKE_FILTER:-GroupedGemmFp8.PlainSplitNSmallGroups:GroupedGemmFp8.Gemm1SiluTopk}" || exit 1
if [ "${TESTS:-1}" = 1 ]; then
  step tests "${TEST_TIMEOUT:-240}" env LD_LIBRARY_PATH="$NEW_DIR:$base_ld" "$tests" --gtest_filter="${TEST_FILTER:-GroupedGemmFp8.*}"
  grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$out/tests.log"
fi
for preset in ${PRESETS:-dsv3 qwen3-30b}; do
  for round in 1 2; do
    for s in OLD NEW; do
      name=layer_${preset}_${s}_$round
      step "$name" 150 $(side "$s") bench layer --backend "${BACKENDS:-staged}" --ranks 2 --preset "$preset" \
        --format "${FORMAT:-fp8_block}" --tokens "${TOKENS:-128,2048,8192}" --iters 10 --json "$out/$name.json"
      grep -E "^\| (staged|mega) " "$out/$name.log" | awk -v n="$s$round" -F'|' '{print n, $2, $3, $5, $13}'
    done
  done
done
if [ "${GEMM:-1}" = 1 ]; then
  for s in OLD NEW; do
    step "gemm_$s" 120 $(side "$s") bench gemm --models ${GEMM_MODELS:-dsv3 qwen3-30b} --rows ${GEMM_ROWS:-160 576} \
      --experts ${GEMM_EXPERTS:-64} --no-cublas --json "$out/gemm_$s.json"
    grep -E "gemm[12]" "$out/gemm_$s.log" | sed "s/^/$s /"
  done
fi
(cd "$out" && tar czf results.tgz ./*.log $(ls ./*.json 2>/dev/null) && rm -f ./*.log ./*.json)  # the device returns <= 8 files
