#!/usr/bin/env bash
# One device call (ONE H200, <= BUDGET_S s, default 570): the multi-rank EP suites on in-process ranks of one GPU
# (EpGroup::loopback, tests/gpu/test_ep_loopback.cu: 2, 3, 4 and 8 ranks, one SM partition each; mega's with MEGA=1,
# the default, ~7.5 min; the dispatcher's and staged's with MEGA=0 ALL_LOOPBACK=1, ~4 min), then the one-rank
# EP / staged / mega tests that the library change touches (EpGroup creation, the collective entry points), then,
# with WHOLE_SUITE=1, the whole one-GPU suite in two shards.
# Prebuilt: scripts/prebuild.sh main; carry .xfer/pre-main (trimmed: megamoe, libmegamoe.so, tests/megamoe_tests_gpu).
#   source scripts/use_prebuilt.sh main && OUT=$OUT bash scripts/gpu_loopback.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh main first}; T=$B/tests
budget_s=${BUDGET_S:-570}; pack_name=${PACK_NAME:-loopback.tgz}
source scripts/device_steps.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$logs/gpu.txt"
export MEGAMOE_TEST_LAUNCH_TIMEOUT_S=${LAUNCH_TIMEOUT_S:-150}
step test_loopback_errors 60 "$T/megamoe_tests_gpu" --gtest_filter='EpLoopbackErrors.*'
# STAGED_REPEAT > 0: first the staged suites at 4 and 8 ranks that many times (timeouts at 3 s to fail fast).
if [ "${STAGED_REPEAT:-0}" -gt 0 ]; then
  MEGAMOE_EP_TIMEOUT_MS=3000 step test_loopback_staged 240 "$T/megamoe_tests_gpu" --gtest_repeat="$STAGED_REPEAT" \
    --gtest_filter='Ranks/EpLoopback.Staged*/8ranks:Ranks/EpLoopback.Staged*/4ranks'
fi
# MEGA=1 (default): the mega suites on in-process ranks (Ranks/EpLoopback.Mega*, session 24; one H200: ~100 s at 2
# ranks, ~110 s per rank count at 3, 4, 8, most of it MegaSplitPathAndManyGemm2TilesPerCta's host reference), 2 ranks
# first; MEGA_FILTER replaces the 3 / 4 / 8-rank step's filter.
if [ "${MEGA:-1}" = 1 ]; then
  [ -z "${MEGA_FILTER:-}" ] && step test_loopback_mega_2 ${MEGA_2_LIMIT:-180} "$T/megamoe_tests_gpu" \
    --gtest_filter='Ranks/EpLoopback.Mega*/2ranks'
  step test_loopback_mega_348 ${MEGA_348_LIMIT:-420} "$T/megamoe_tests_gpu" \
    --gtest_filter="${MEGA_FILTER:-Ranks/EpLoopback.Mega*/3ranks:Ranks/EpLoopback.Mega*/4ranks:Ranks/EpLoopback.Mega*/8ranks}"
fi
# ALL_LOOPBACK=1: the dispatcher and staged suites on in-process ranks (session 23, ~4 min; with MEGA=0 to fit one call).
if [ "${ALL_LOOPBACK:-0}" = 1 ]; then
  step test_loopback_2 200 "$T/megamoe_tests_gpu" --gtest_filter='Ranks/EpLoopback.*/2ranks-Ranks/EpLoopback.Mega*'
  step test_loopback_348 300 "$T/megamoe_tests_gpu" \
    --gtest_filter='Ranks/EpLoopback.*/3ranks:Ranks/EpLoopback.*/4ranks:Ranks/EpLoopback.*/8ranks-Ranks/EpLoopback.Mega*'
fi
[ "${ONE_RANK:-1}" = 1 ] && step test_one_rank 150 "$T/megamoe_tests_gpu" --gtest_filter="${ONE_RANK_FILTER:-EpSingle.*:StagedPhaseTiming.*:MoeWorkspace*:MegaSingle.*Fp8*}"
if [ "${WHOLE_SUITE:-0}" = 1 ]; then
  SHARD_GPUS="0 0" step_sharded_gpu_suite test_gpu_suite "${WHOLE_LIMIT:-330}" "$T/megamoe_tests_gpu"
fi
echo; echo "loopback test times:"; grep -hE "^\[       OK \]|^\[  FAILED  \]|^\[  SKIPPED \]" "$logs"/test_loopback_*.log | grep -v "^\[  FAILED  \] .* tests\?, listed" || true
grep -h "^\[loopback\]" "$logs"/test_loopback_*.log | sort | uniq -c
echo; print_test_counts
print_summary
