#!/usr/bin/env bash
# One device call (2 x H200) for the mega split path (docs/mega.md "Split path"), with binaries prebuilt
# here by the lead (from the mega-split tree: scripts/prebuild.sh mega-split), carrying
# .xfer/pre-mega-split and .xfer/mega-split; run from the shipped checkout's root:
#   OUT=$OUT bash .xfer/mega-split/scripts/gpu_mega_split.sh   (logs + JSON in one tgz per step; table last)
# (CPU tests run here, not there: MegaPathHeuristics.*, BenchLayerCli.*.)
# Steps: MegaSingle.* and MoeWorkspace*.* (one GPU), MegaMulti.* + MoeWorkspaceMulti.* (2 ranks),
# bench layer dsv3 fp8 and qwen3-30b fp8 with staged and mega on both paths (--mega-path both) and
# under the heuristic (--mega-path auto) at 128, 512, 2048, 8192 tokens per rank.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
here=$(cd "$(dirname "$0")/.." && pwd)  # this tree (fixtures); .xfer/pre-mega-split is under $PWD
source "$here/scripts/use_prebuilt.sh" mega-split "$here" >/dev/null || exit 1
B=$PREBUILT; T=$B/tests
summary=()
pack() { tar -czf "$out/mega_split.tgz" -C "$logs" . 2>/dev/null; }
start=$(date +%s)
step() {  # step NAME TIMEOUT command...  (each limit clamped so that the call ends within ~570 s)
  local name=$1 limit=$2; shift 2; local t0=$(date +%s) rc=0
  local left=$(( 570 - (t0 - start) ))
  if [ "$left" -lt 20 ]; then summary+=("$name|skipped (time)|-"); return 1; fi
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($rc)|$(( $(date +%s) - t0 ))s"); grep -E "FAILED|Failure|error" "$logs/$name.log" | head -12; fi
  pack; return $rc
}
# The one-GPU suites on GPU 0 beside the 2-rank suite would share GPU 0 with rank 0: run them in turn.
step test_mega_single 150 env CUDA_VISIBLE_DEVICES=0 "$T/megamoe_tests_gpu" \
  --gtest_filter='MegaSingle.*:MoeWorkspaceSingle.*:MoeWorkspaceSplit.*:StagedPhaseTiming*'
step test_mega_multi 180 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu" --gtest_filter='MegaMulti.*:MoeWorkspace*'
# Both paths first (the comparison the heuristic rests on), then the heuristic's own rows if time is left.
for preset in dsv3 qwen3-30b; do
  step "layer_${preset}_both" 200 "$B/megamoe" bench layer --backend staged,mega --mega-path both --ranks 2 \
    --preset "$preset" --format fp8_block --tokens 128,512,2048,8192 --iters 10 --json "$logs/layer_${preset}_both.json"
done
for preset in qwen3-30b dsv3; do
  step "layer_${preset}_auto" 120 "$B/megamoe" bench layer --backend mega --mega-path auto --ranks 2 \
    --preset "$preset" --format fp8_block --tokens 128,512,2048,8192 --iters 5 --json "$logs/layer_${preset}_auto.json"
done
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$logs"/test_*.log 2>/dev/null | sort | uniq -c | head -30
# Short table: median µs per token count, staged vs mega[fused] vs mega[split] vs mega[auto:*].
for f in "$logs"/layer_*.json; do
  [ -f "$f" ] || continue
  python3 - "$f" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rows = {}
for c in j["cases"]:
    rows.setdefault(c["tokens"], []).append("%s %.0f" % (c["backend"], c["median_us"]))
print("==", j["shape"]["preset"], sys.argv[1].rsplit("/", 1)[-1])
for t in sorted(rows): print("  %6d tok: %s" % (t, " | ".join(rows[t])))
PY
done
printf '\n%-22s %-22s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-22s %-22s %s\n' "$a" "$b" "$c"; done
pack
