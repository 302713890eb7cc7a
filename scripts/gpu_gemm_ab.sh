#!/usr/bin/env bash
# One device call: A/B of two prebuilt GEMM builds (scripts/prebuild.sh), side by side in one run.
#   OUT=$OUT bash scripts/gpu_gemm_ab.sh OLD NEW      (carry .xfer/pre-OLD and .xfer/pre-NEW; ~150-250 s)
# Steps (each bounded by timeout; a hang in NEW shows up in the 30 s smoke test, not after minutes):
#   1. smoke: two small GroupedGemmFp8 tests of NEW;  2. TEST_FILTER (default GroupedGemmFp8.*) of NEW;
#   3. bench gemm OLD, NEW, OLD, NEW (MODELS, ROWS; cuBLASLt in OLD's runs only);  4. memcheck of
#   SANITIZE_FILTER on NEW (SANITIZE=0 skips).  Logs are tarred (the device returns at most 8 files).
set -uo pipefail
old=${1:?usage: gpu_gemm_ab.sh OLD NEW}; new=${2:?usage: gpu_gemm_ab.sh OLD NEW}
out=${OUT:-out}; mkdir -p "$out"
source scripts/use_prebuilt.sh "$old" >/dev/null || exit 1; OLD_DIR=$PREBUILT
source scripts/use_prebuilt.sh "$new" >/dev/null || exit 1; NEW_DIR=$PREBUILT
tests=$NEW_DIR/tests/megamoe_tests_gpu
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout "$limit" "$@" >"$out/$name.log" 2>&1
         local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; return $rc; }
step smoke 30 "$tests" --gtest_filter='GroupedGemmFp8.PlainSplitNSmallGroups:GroupedGemmFp8.Gemm1SiluTopk' || exit 1
step tests "${TEST_TIMEOUT:-200}" "$tests" --gtest_filter="${TEST_FILTER:-GroupedGemmFp8.*}"
grep -E "^\[  (PASSED|FAILED) " "$out/tests.log"
read -r -a models <<<"${MODELS:-dsv3 ms4 qwen3-30b}"; read -r -a rows <<<"${ROWS:-32 1024 4096}"
for round in 1 2; do
  for side in OLD NEW; do
    dir=${side}_DIR; extra=(); [ "$side" = NEW ] && extra=(--no-cublas)
    step "gemm_${side}_$round" 60 "${!dir}/megamoe" bench gemm --schedule serial --models "${models[@]}" \
      --rows "${rows[@]}" "${extra[@]}" --json "$out/gemm_${side}_$round.json"
    grep -E "gemm[12]" "$out/gemm_${side}_$round.log"
  done
done
if [ "${SANITIZE:-1}" = 1 ]; then
  step memcheck 120 compute-sanitizer --tool memcheck --error-exitcode 1 "$tests" \
    --gtest_filter="${SANITIZE_FILTER:-GroupedGemmFp8.PlainSplitNSmallGroups:GroupedGemmFp8.Gemm1SiluTopk}"
  grep -E "ERROR SUMMARY" "$out/memcheck.log"
fi
(cd "$out" && tar czf logs.tgz ./*.log && rm -f ./*.log)
