#!/usr/bin/env bash
# One device call (one H200, <= 280 s) that verifies and measures branch swiglu-spread: the spread SwiGLU
# epilogue (swiglu_quant_fp8_spread_epilogue) of 64 x 256 GEMM-1 tiles with few rows, FP8 split-N and W4A8
# 2-warpgroup kernels. Prebuilt binaries in .xfer/pre-swiglu-spread; run from the shipped checkout's root:
#   OUT=$OUT bash scripts/gpu_swiglu_spread.sh [SOURCE-TREE]
# Steps: every grouped-GEMM test (the FP8 header changed), then bench gemm GEMM 1 with MEGAMOE_SWIGLU_SPREAD=0
# and =1 alternating in separate processes, two rounds: FP8 dsv3 / qwen3-30b at 8-64 rows; W4A8 nvfp4 on the
# 2-warpgroup kernel (MEGAMOE_W4A8_SMALL_M=0) and, as the reference, the default small-M kernel. Last a table.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
source scripts/use_prebuilt.sh swiglu-spread "${1:-.}" >/dev/null || exit 1
B=$PREBUILT; T=$B/tests
budget_s=275; pack_name=swiglu_spread.tgz
source scripts/device_steps.sh
step test_gemm 150 "$T/megamoe_tests_gpu" --gtest_filter='GroupedGemm*'
for round in 1 2; do
  for s in 0 1; do
    step "fp8_${round}_$s" 20 env MEGAMOE_SWIGLU_SPREAD=$s "$B/megamoe" bench gemm --format fp8 \
      --models dsv3 qwen3-30b --rows 8 16 32 64 --no-cublas --json "$logs/fp8_${round}_$s.json"
    step "w4a8_${round}_$s" 20 env MEGAMOE_W4A8_SMALL_M=0 MEGAMOE_SWIGLU_SPREAD=$s "$B/megamoe" bench gemm \
      --format nvfp4 --models dsv3 qwen3-30b --rows 8 16 32 64 --no-cublas --json "$logs/w4a8_${round}_$s.json"
  done
  step "w4a8_${round}_smallm" 20 "$B/megamoe" bench gemm --format nvfp4 --models dsv3 qwen3-30b --rows 8 16 32 64 \
    --no-cublas --json "$logs/w4a8_${round}_smallm.json"
done
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED  \]|spread vs pair" "$logs"/test_*.log | sort | uniq -c
python3 - "$logs" <<'PY'
import json, os, sys, collections
d = sys.argv[1]
t = collections.defaultdict(lambda: collections.defaultdict(list))
for name in os.listdir(d):
    if not name.endswith(".json"): continue
    kind, rnd, var = name[:-5].split("_")
    for r in json.load(open(os.path.join(d, name))):
        if r["gemm"] != "gemm1": continue
        t[(kind, r["model"], r["rows_per_expert"])][var].append(r["us"])
print("%-5s %-10s %5s | %9s %9s %7s | %9s" % ("kind", "model", "rows", "spread0", "spread1", "speedup", "smallM"))
for k in sorted(t):
    v = t[k]; a = min(v["0"]) if v["0"] else 0; b = min(v["1"]) if v["1"] else 0
    c = "%9.1f" % min(v["smallm"]) if v["smallm"] else "%9s" % "-"
    print("%-5s %-10s %5d | %9.1f %9.1f %7.3f | %s" % (k[0], k[1], k[2], a, b, a / b if b else 0, c))
PY
print_summary
pack
