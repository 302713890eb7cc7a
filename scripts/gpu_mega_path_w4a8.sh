#!/usr/bin/env bash
# One device call (2 x H200) that verifies branch mega-path-w4a8 = main (session 9's end: small-M W4A8
# kernel for GEMM 1, suspend hint off, shared W4A8 producer warpgroup) + the mega path heuristic by weight
# format (W4A8 takes the split path from one row per local expert up; docs/mega.md "Split path"), and
# measures issue 4's ratio to the plain torch layer side by side. Prebuilt by the lead from that tree
# (scripts/prebuild.sh mega-path-w4a8), its tracked files copied to .xfer/mega-path-w4a8; carry both; run
# from the shipped checkout's root:
#   OUT=$OUT bash .xfer/mega-path-w4a8/scripts/gpu_mega_path_w4a8.sh
# Steps: the whole one-GPU suite (sharded over both GPUs), the whole 2-rank suite, bench layer dsv3
# nvfp4 / mxfp4 (staged, mega on both paths, mega under the heuristic: expected mega[auto:split]), dsv3
# FP8 staged / mega beside bench/torch_moe_layer.py (grouped and per-expert GEMMs).
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/use_prebuilt.sh" mega-path-w4a8 "$here" >/dev/null || exit 1
B=$PREBUILT; T=$B/tests; summary=(); start=$(date +%s)
pack() { tar -czf "$out/mega_path_w4a8.tgz" -C "$logs" . 2>/dev/null; }
step() {
  local name=$1 limit=$2; shift 2; local t0=$(date +%s) rc=0 left=$(( 550 - ($(date +%s) - start) ))
  [ "$left" -lt 15 ] && { summary+=("$name|skipped|-"); return 1; }
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  summary+=("$name|$([ $rc -eq 0 ] && echo ok || echo "FAIL($rc)")|$(( $(date +%s) - t0 ))s")
  [ $rc -ne 0 ] && grep -E "FAILED|Failure|rror" "$logs/$name.log" | head -10
  pack; return $rc
}
step test_gpu 150 bash -c 'pids=(); rc=0; for i in 0 1; do
    CUDA_VISIBLE_DEVICES=$i GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i "$0" >"$1.$i" 2>&1 & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done; cat "$1".*; exit $rc' "$T/megamoe_tests_gpu" "$logs/test_gpu_shard"
step test_multigpu 220 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
for fmt in nvfp4 mxfp4; do
  step "layer_$fmt" 60 "$B/megamoe" bench layer --backend staged,mega --mega-path both --ranks 2 --preset dsv3 \
    --format $fmt --tokens 128,512,2048 --iters 5 --json "$logs/layer_$fmt.json"
  step "layer_${fmt}_auto" 40 "$B/megamoe" bench layer --backend mega --mega-path auto --ranks 2 --preset dsv3 \
    --format $fmt --tokens 128,512 --iters 5 --json "$logs/layer_${fmt}_auto.json"   # expected: mega[auto:split]
done
step layer_fp8 60 "$B/megamoe" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format fp8_block \
  --tokens 128,2048,8192 --iters 10 --json "$logs/layer_fp8.json"
step torch_layer 90 python3 "$here/bench/torch_moe_layer.py" --ranks 2 --preset dsv3 --tokens 128,2048,8192 \
  --gemm grouped --json "$logs/torch_layer_grouped.json"
step torch_layer_loop 60 python3 "$here/bench/torch_moe_layer.py" --ranks 2 --preset dsv3 --tokens 8192 --gemm loop \
  --json "$logs/torch_layer_loop.json"
grep -hE "^\[  (PASSED|FAILED) " "$logs"/test_*.log | sort | uniq -c
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
def load(name):
    p = os.path.join(d, name)
    return json.load(open(p)) if os.path.exists(p) else None
for name in ("layer_nvfp4", "layer_nvfp4_auto", "layer_mxfp4", "layer_mxfp4_auto", "layer_fp8"):
    j = load(name + ".json")
    if j:
        print("==", name, " | ".join("%s %d: %.0f us" % (c["backend"], c["tokens"], c["median_us"]) for c in j["cases"]))
ours = load("layer_fp8.json")
torch_us = {}
for j in (load("torch_layer_grouped.json"), load("torch_layer_loop.json")):
    for c in (j or {}).get("cases", []):
        torch_us.setdefault(c["tokens"], []).append((j["gemm"], c["slowest_rank_median_us"]))
for c in (ours or {}).get("cases", []):
    for gemm, t in torch_us.get(c["tokens"], []):
        print("  %6d tok  %-18s %8.0f us   torch[%s] %9.0f us   speed-up %.2fx" % (
            c["tokens"], c["backend"], c["median_us"], gemm, t, t / c["median_us"]))
PY
printf '\n%-20s %-12s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-20s %-12s %s\n' "$a" "$b" "$c"; done
pack
