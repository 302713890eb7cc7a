#!/usr/bin/env bash
# One device call (2 x H200, <= 560 s) that verifies main after session 11's merge (spread SwiGLU epilogue for
# 64 x 256 GEMM-1 tiles with few rows; W4A8 GEMM 1 on the 2-warpgroup kernel up to 32 rows) and measures its
# layer effect. Prebuilt: scripts/prebuild.sh main; carry .xfer/pre-main; from the checkout's root:
#   OUT=$OUT bash scripts/gpu_session11.sh
# Steps: the whole one-GPU suite (sharded over both GPUs); bench layer dsv3 staged at 128 tokens per rank,
# FP8 / nvfp4 / mxfp4, MEGAMOE_SWIGLU_SPREAD=0 (the old epilogue and kernel choice) and =1 alternating, two
# rounds; the whole 2-rank suite with the time left. Last a table.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
source scripts/use_prebuilt.sh main >/dev/null || exit 1
B=$PREBUILT; T=$B/tests
budget_s=550; pack_name=session11.tgz
source scripts/device_steps.sh
step test_gpu 160 bash -c 'pids=(); rc=0; for i in 0 1; do
    CUDA_VISIBLE_DEVICES=$i GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i "$0" >"$1.$i" 2>&1 & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done; cat "$1".*; exit $rc' "$T/megamoe_tests_gpu" "$logs/test_gpu_shard"
for round in 1 2; do
  for fmt in fp8_block nvfp4 mxfp4; do
    for s in 0 1; do
      step "layer_${fmt}_${s}_$round" 40 env MEGAMOE_SWIGLU_SPREAD=$s "$B/megamoe" bench layer --backend staged \
        --ranks 2 --preset dsv3 --format $fmt --tokens 128 --iters 10 --json "$logs/layer_${fmt}_${s}_$round.json"
    done
  done
done
step test_multigpu 240 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$logs"/test_*.log | sort | uniq -c
python3 - "$logs" <<'PY'
import json, os, sys, collections
d = sys.argv[1]; t = collections.defaultdict(lambda: collections.defaultdict(list))
for name in sorted(os.listdir(d)):
    if not (name.startswith("layer_") and name.endswith(".json")): continue
    parts = name[:-5].split("_"); fmt, s = "_".join(parts[1:-2]), parts[-2]
    for c in json.load(open(os.path.join(d, name)))["cases"]:
        t[(fmt, c["tokens"])][s].append(c["median_us"])
print("%-10s %6s | %10s %10s | %7s" % ("format", "tokens", "spread0_us", "spread1_us", "speedup"))
for k in sorted(t):
    a = min(t[k]["0"]) if t[k]["0"] else 0; b = min(t[k]["1"]) if t[k]["1"] else 0
    print("%-10s %6d | %10.0f %10.0f | %7.3f   (all: %s / %s)" % (k[0], k[1], a, b, a / b if b else 0,
          ["%.0f" % x for x in t[k]["0"]], ["%.0f" % x for x in t[k]["1"]]))
PY
print_summary
pack
