#!/usr/bin/env bash
# One device call (2 x H200, prebuilt main: scripts/prebuild.sh main, carry .xfer/pre-main) for the two open
# session-7 questions (docs/perf.md "Open: a hang", docs/mega.md "Where mega loses to staged"):
#   1. the full-buffer GEMM tests (the GEMMs of the hang's case alone, one GPU; compute-sanitizer synccheck
#      of them if they time out);
#   2. MegaMulti.ManyGemm2TilesPerCta with MEGAMOE_STAGED_ROWS_HINT=auto (line-buffered ranks now show
#      where rank 0 stops);
#   3. mega GEMM 2: bench layer with and without MEGAMOE_MEGA_DIAG_LOCAL_COMBINE=1 (timing only).
#   OUT=$OUT bash scripts/gpu_hint_hang.sh          (logs in one tgz; a short summary last)
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
source scripts/use_prebuilt.sh main >/dev/null || exit 1
T=$PREBUILT/tests
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s); timeout "$limit" "$@" >"$out/$name.log" 2>&1
         local rc=$?; echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; return $rc; }
step gemm_full 150 "$T/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.*FullBuffer*'
rc=$?; grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^\[ RUN" "$out/gemm_full.log" | tail -4
if [ $rc = 124 ]; then
  step synccheck 200 compute-sanitizer --tool synccheck "$T/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.*FullBuffer*'
  tail -15 "$out/synccheck.log"
fi
step mm_hint 150 env MEGAMOE_STAGED_ROWS_HINT=auto MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu" \
  --gtest_filter='MegaMulti.ManyGemm2TilesPerCta'
grep -vE "^Note|^\[-|^\[=|^$" "$out/mm_hint.log" | tail -14
for diag in 0 1; do
  step "mega_diag$diag" 120 env MEGAMOE_MEGA_DIAG_LOCAL_COMBINE=$diag "$PREBUILT/megamoe" bench layer --backend mega \
    --ranks 2 --preset dsv3 --format fp8_block --tokens 2048,8192 --iters 10 --json "$out/mega_diag$diag.json"
  grep -E "^\| mega" "$out/mega_diag$diag.log" | cut -c1-60,150-260 | sed "s/^/diag=$diag /"
done
(cd "$out" && tar czf hint_hang.tgz ./*.log $(ls ./*.json 2>/dev/null) && rm -f ./*.log ./*.json)
