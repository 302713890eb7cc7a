#!/usr/bin/env bash
# One device call (2 x H200) for branch mega-path-w4a8 (the mega path heuristic by weight format: W4A8
# takes the split path whenever the agreed token count is known; docs/mega.md "Split path"), prebuilt
# by the lead from that tree (scripts/prebuild.sh mega-path-w4a8) and its tracked files copied to
# .xfer/mega-path-w4a8; carry both; run from the shipped checkout's root:
#   OUT=$OUT bash .xfer/mega-path-w4a8/scripts/gpu_mega_path_w4a8.sh
# Steps: MegaSingle.* (one GPU; its W4A8 cases under the heuristic now take the split path, the fused-
# specific ones pin mega[fused]), MegaMulti.* (2 ranks), bench layer dsv3 nvfp4 / mxfp4 mega[auto] vs both paths.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/use_prebuilt.sh" mega-path-w4a8 "$here" >/dev/null || exit 1
B=$PREBUILT; T=$B/tests; summary=(); start=$(date +%s)
pack() { tar -czf "$out/mega_path_w4a8.tgz" -C "$logs" . 2>/dev/null; }
step() {
  local name=$1 limit=$2; shift 2; local t0=$(date +%s) rc=0 left=$(( 540 - ($(date +%s) - start) ))
  [ "$left" -lt 15 ] && { summary+=("$name|skipped|-"); return 1; }
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  summary+=("$name|$([ $rc -eq 0 ] && echo ok || echo "FAIL($rc)")|$(( $(date +%s) - t0 ))s")
  [ $rc -ne 0 ] && grep -E "FAILED|Failure|rror" "$logs/$name.log" | head -10
  pack; return $rc
}
step test_mega_single 150 env CUDA_VISIBLE_DEVICES=0 "$T/megamoe_tests_gpu" --gtest_filter='MegaSingle.*:MoeWorkspace*'
step test_mega_multi 200 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu" --gtest_filter='MegaMulti.*'
for fmt in nvfp4 mxfp4; do
  step "layer_$fmt" 90 "$B/megamoe" bench layer --backend staged,mega --mega-path both --ranks 2 --preset dsv3 \
    --format $fmt --tokens 128,512,2048 --iters 5 --json "$logs/layer_$fmt.json"
  step "layer_${fmt}_auto" 60 "$B/megamoe" bench layer --backend mega --mega-path auto --ranks 2 --preset dsv3 \
    --format $fmt --tokens 128,512 --iters 5 --json "$logs/layer_${fmt}_auto.json"   # expected: mega[auto:split]
done
grep -hE "^\[  (PASSED|FAILED) " "$logs"/test_*.log | sort | uniq -c
for f in "$logs"/layer_*.json; do python3 -c "
import json,sys; j=json.load(open(sys.argv[1]))
print('==', j['format'], ' | '.join('%s %d: %.0f us' % (c['backend'], c['tokens'], c['median_us']) for c in j['cases']))" "$f"; done
printf '\n%-20s %-12s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-20s %-12s %s\n' "$a" "$b" "$c"; done
pack
