#!/usr/bin/env bash
# One device call (2 x H200, <= 300 s; branch mega-interleaved, issue 5): the fused mega kernel's FP8 GEMM 1 on the ONE
# W13 in staged's packing (kGateUpInterleaved8; docs/mega.md "One W13"), no second W13 for the split path.
# (1) MegaSingle.* on both GPUs (sharded): every test's mega vs staged bit for bit, plus OneW13RowsPerExpert* (0 / 1 /
#     8 / 16 / 32 / 33 rows per expert, a mix, 128-row tiles: mega[fused] == mega[split] == staged == the old fused
#     kernel on its own kGateUp W13 via MEGAMOE_MEGA_OWN_GATE_UP=1). (2) MegaMulti.* on 2 ranks (FP8 / BF16 routings,
#     split path, changing T, many GEMM-2 tiles, OneW13RowsPerLocalExpert*: the rows cases on 2 ranks vs single-rank
#     staged and vs the old kernel; W4A8-only and stalled-peer tests left out for time). (3) bench
#     layer --mega-path both, dsv3 / ms4 / qwen3-30b FP8, 2 ranks, 128 / 256 / 512 tokens per rank (rows per local
#     expert: dsv3 and ms4 8 / 16 / 32, qwen3-30b 16 / 32 / 64), rounds: new, OLD (MEGAMOE_MEGA_OWN_GATE_UP=1: the
#     split-N GEMM 1 on kGateUp + the split path's copy),
#     new; the weight memory per rank and layer that the mega backends log (MEGAMOE_MEGA_LOG_MEMORY=1). (4) tables last.
#   source scripts/use_prebuilt.sh mega-interleaved .xfer/mega-interleaved && \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/mega-interleaved/scripts/gpu_mega_interleaved.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh mega-interleaved .xfer/mega-interleaved first}; T=$B/tests
budget_s=${BUDGET_S:-295}; pack_name=mega_interleaved.tgz
source "$(dirname "$0")/device_steps.sh"
export GTEST_FILTER='MegaSingle.*'
step_sharded_gpu_suite test_single 85 "$T/megamoe_tests_gpu"
unset GTEST_FILTER
# MegaMulti.* without the W4A8-only tests (their kernels and packing are untouched: same SASS resources as main) and
# the stalled-peer timeout test: ~100 s of session 13's 160.
step test_multi 115 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu" \
  --gtest_filter='MegaMulti.*:-MegaMulti.StalledPeer*:MegaMulti.Nvfp4*:MegaMulti.Mxfp4*:MegaMulti.W4a8*'
for round in new old new2; do
  own=0; [ "$round" = old ] && own=1
  for model in dsv3 ms4 qwen3-30b; do
    step "layer_${model}_$round" 20 env MEGAMOE_MEGA_OWN_GATE_UP=$own MEGAMOE_MEGA_LOG_MEMORY=1 "$B/megamoe" bench layer \
      --backend staged,mega --mega-path both --ranks 2 --preset "$model" --format fp8_block --tokens 128,256,512 \
      --iters 6 --json "$logs/layer_${model}_$round.json"
  done
done
print_test_counts
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$logs"/test_single.log "$logs"/test_multi.log | sort | uniq -c
echo "weight memory per rank and layer (mega backends' log, new = one W13, old = MEGAMOE_MEGA_OWN_GATE_UP=1):"
for f in "$logs"/layer_*_new.log "$logs"/layer_*_old.log; do
  [ -f "$f" ] && grep -h "mega weights rank 0" "$f" | sort | uniq -c | sed "s|^|  $(basename "$f" .log): |"
done
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
res = {}
for f in sorted(os.listdir(d)):
    if not (f.startswith("layer_") and f.endswith(".json")): continue
    model, rnd = f[6:-5].rsplit("_", 1)
    for r in json.load(open(os.path.join(d, f)))["cases"]:
        res.setdefault((model, r["tokens"]), {}).setdefault((r["backend"], rnd), r["median_us"])
print("2 ranks FP8, rank-0 median us; new = one W13 (interleaved fused GEMM 1), old = MEGAMOE_MEGA_OWN_GATE_UP=1")
print("%-10s %5s | %9s %9s %9s | %9s %9s | %9s | %s" % ("model", "tok", "fused", "fused2", "fusedOLD", "split",
      "splitOLD", "staged", "fused/split  fused/fusedOLD"))
for (model, tok), v in sorted(res.items()):
    g = lambda b, r: v.get((b, r), float("nan"))
    fn, fn2, fo = g("mega[fused]", "new"), g("mega[fused]", "new2"), g("mega[fused]", "old")
    sn, so, st = g("mega[split]", "new"), g("mega[split]", "old"), g("staged", "new")
    best = min(x for x in (fn, fn2) if x == x) if (fn == fn or fn2 == fn2) else float("nan")
    print("%-10s %5d | %9.1f %9.1f %9.1f | %9.1f %9.1f | %9.1f | %.3f  %.3f" % (model, tok, fn, fn2, fo, sn, so, st,
          best / sn, best / fo))
PY
print_summary
pack
