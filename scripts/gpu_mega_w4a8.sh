#!/usr/bin/env bash
# One device call for branch mega-w4a8 (mega with W4A8 nvfp4 / mxfp4) with binaries compiled here
# (scripts/prebuild.sh mega-w4a8): a smoke test (one MegaSingle nvfp4 case, 40 s), MegaSingle.* (all
# formats), GroupedGemmW4a8.* (the standalone W4A8 GEMM after its refactor into pieces), MegaMulti.* on
# 2 ranks, then `bench layer` staged vs mega, dsv3, nvfp4 at 128/2048/8192 and
# mxfp4 at 128/8192 tokens/rank. If the smoke test fails, only MegaSingle.*/fp8_block runs after it (to
# tell a W4A8 bug from a regression). Logs + JSON are tarred into $OUT/mega_w4a8_logs.tgz after every
# step, so a call cut short still returns what ran. Run from the checkout the device tool ships,
# carrying .xfer/pre-mega-w4a8 (this script is copied there too):
#   bash .xfer/pre-mega-w4a8/gpu_mega_w4a8.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
source scripts/use_prebuilt.sh mega-w4a8 >/dev/null; B=$PREBUILT
summary=()
pack() { tar -czf "$out/mega_w4a8_logs.tgz" -C "$logs" . 2>/dev/null; }
step() {  # step NAME TIMEOUT command...
  local name=$1 limit=$2; shift 2; local t0=$(date +%s) rc=0
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($rc)|$(( $(date +%s) - t0 ))s"); tail -20 "$logs/$name.log"; fi
  pack; return $rc
}
bench() {  # bench NAME FORMAT TOKENS
  step "$1" 150 "$B/megamoe" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format "$2" \
       --tokens "$3" --iters 10 --json "$logs/$1.json"
}
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$logs/gpus.txt"
if step smoke 40 "$B/tests/megamoe_tests_gpu" --gtest_filter='MegaSingle.MatchesReferenceAndStagedReplaysAndRepeats/nvfp4'; then
  step single 150 "$B/tests/megamoe_tests_gpu" --gtest_filter='MegaSingle.*'
  step w4a8gemm 60 "$B/tests/megamoe_tests_gpu" --gtest_filter='GroupedGemmW4a8.*'
  step multi 150 env MEGAMOE_TEST_RANKS=2 "$B/tests/megamoe_tests_multigpu" --gtest_filter='MegaMulti.*'
  bench layer_nvfp4 nvfp4 128,2048,8192
  bench layer_mxfp4 mxfp4 128,8192
else
  step single_fp8 100 "$B/tests/megamoe_tests_gpu" --gtest_filter='MegaSingle.*/fp8_block'
fi
grep -hE "^\[  (FAILED|PASSED) |^\[ +OK \]|\[mega phases\]" "$logs"/smoke.log "$logs"/single*.log "$logs"/w4a8gemm.log "$logs"/multi.log 2>/dev/null | head -60
for f in layer_nvfp4 layer_mxfp4; do [ -f "$logs/$f.log" ] && { echo "== $f"; grep -E "^\| (staged|mega)|^(staged|mega) " "$logs/$f.log"; }; done
printf '\n%-12s %-9s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-12s %-9s %s\n' "$a" "$b" "$c"; done
pack
