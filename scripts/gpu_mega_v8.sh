#!/usr/bin/env bash
# One device call for branch mega-v8 with binaries compiled here (scripts/prebuild.sh): part B
# (v8 port, .xfer/pre-mega-v8b) smoke test, MegaSingle.*, MegaMulti.* on 2 ranks and the dsv3 layer
# bench; part A (phase timing on the v7 kernel, .xfer/pre-mega-v8) its timing test and the same bench,
# so v7 and v8 splits come from one call. If part B's smoke test fails, part A's suites run instead.
# Run from the checkout the device tool ships, carrying .xfer/pre-mega-v8 and .xfer/pre-mega-v8b:
#   bash .xfer/pre-mega-v8b/gpu_mega_v8.sh        (logs + JSON in $OUT)
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
source scripts/use_prebuilt.sh mega-v8b >/dev/null; B=$PREBUILT
source scripts/use_prebuilt.sh mega-v8 >/dev/null; A=$PREBUILT
summary=()
step() {  # step NAME TIMEOUT command...
  local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($?)|$(( $(date +%s) - t0 ))s"); tail -25 "$out/$name.log"; fi
}
bench() {  # bench BIN NAME
  step "$2" 200 "$1/megamoe" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format fp8_block \
       --tokens 128,2048,8192 --iters 10 --json "$out/$2.json"
}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$out/gpus.txt"
if step smoke_b 30 "$B/tests/megamoe_tests_gpu" --gtest_filter='MegaSingle.MatchesReferenceAndStagedReplaysAndRepeats/fp8_block'; then
  step single_b 150 "$B/tests/megamoe_tests_gpu" --gtest_filter='MegaSingle.*'
  step multi_b 150 env MEGAMOE_TEST_RANKS=2 "$B/tests/megamoe_tests_multigpu" --gtest_filter='MegaMulti.*'
  bench "$B" layer_b
  step timing_a 60 "$A/tests/megamoe_tests_gpu" --gtest_filter='MegaSingle.PhaseTiming*'
  bench "$A" layer_a
else
  step single_a 150 "$A/tests/megamoe_tests_gpu" --gtest_filter='MegaSingle.*'
  step multi_a 150 env MEGAMOE_TEST_RANKS=2 "$A/tests/megamoe_tests_multigpu" --gtest_filter='MegaMulti.*'
  bench "$A" layer_a
fi
grep -hE "^\[  (FAILED|PASSED) |\[mega phases\]" "$out"/smoke_b.log "$out"/single_*.log "$out"/multi_*.log "$out"/timing_a.log 2>/dev/null | head -40
for f in layer_a layer_b; do [ -f "$out/$f.log" ] && { echo "== $f"; grep -E "^\| (staged|mega)|^split" "$out/$f.log"; }; done
printf '\n%-10s %-9s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-10s %-9s %s\n' "$a" "$b" "$c"; done
