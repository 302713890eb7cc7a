#!/usr/bin/env bash
# One device call (2 x H200, <= 560 s) for branch mega-spread (the fused mega kernel's FP8 GEMM 1 with the spread
# SwiGLU epilogue; prebuilt: scripts/prebuild.sh mega-spread in its worktree -> .xfer/pre-mega-spread, made from
# main + that one commit, so it also verifies main). Carry .xfer/pre-mega-spread; from main's root:
#   OUT=$OUT bash scripts/gpu_mega_spread.sh
# Steps: the whole one-GPU suite (sharded over both GPUs); bench layer dsv3 FP8 at 128 and 512 tokens per rank,
# mega fused and staged, MEGAMOE_SWIGLU_SPREAD=0 / 1 alternating, two rounds; the whole 2-rank suite. Last a table.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
source scripts/use_prebuilt.sh mega-spread >/dev/null || exit 1
B=$PREBUILT; T=$B/tests
budget_s=550; pack_name=mega_spread.tgz
source scripts/device_steps.sh
step test_gpu 160 bash -c 'pids=(); rc=0; for i in 0 1; do
    CUDA_VISIBLE_DEVICES=$i GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i "$0" >"$1.$i" 2>&1 & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done; cat "$1".*; exit $rc' "$T/megamoe_tests_gpu" "$logs/test_gpu_shard"
for round in 1 2; do
  for s in 0 1; do
    step "layer_fused_${s}_$round" 45 env MEGAMOE_SWIGLU_SPREAD=$s "$B/megamoe" bench layer --backend mega \
      --mega-path fused --ranks 2 --preset dsv3 --format fp8_block --tokens 128,512 --iters 10 \
      --json "$logs/layer_fused_${s}_$round.json"
    step "layer_staged_${s}_$round" 40 env MEGAMOE_SWIGLU_SPREAD=$s "$B/megamoe" bench layer --backend staged \
      --ranks 2 --preset dsv3 --format fp8_block --tokens 128,512 --iters 10 --json "$logs/layer_staged_${s}_$round.json"
  done
done
step test_multigpu 240 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$logs"/test_*.log | sort | uniq -c
python3 - "$logs" <<'PY'
import json, os, sys, collections
d = sys.argv[1]; t = collections.defaultdict(lambda: collections.defaultdict(list))
for name in sorted(os.listdir(d)):
    if not (name.startswith("layer_") and name.endswith(".json")): continue
    parts = name[:-5].split("_"); backend, s = parts[1], parts[2]
    for c in json.load(open(os.path.join(d, name)))["cases"]:
        t[(backend, c["tokens"])][s].append(c["median_us"])
print("%-7s %6s | %10s %10s | %7s" % ("backend", "tokens", "spread0_us", "spread1_us", "speedup"))
for k in sorted(t):
    a = min(t[k]["0"]) if t[k]["0"] else 0; b = min(t[k]["1"]) if t[k]["1"] else 0
    print("%-7s %6d | %10.0f %10.0f | %7.3f" % (k[0], k[1], a, b, a / b if b else 0))
PY
print_summary
pack
