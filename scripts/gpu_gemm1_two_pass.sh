#!/usr/bin/env bash
# One device call (one H200, <= 150 s) for branch gemm1-two-pass: FP8 GEMM 1 as a plain grouped GEMM (BF16 gate/up)
# + swiglu_quant_fp8 (kernels/swiglu_quant.h, docs/grouped_gemm.md "Two-pass GEMM 1"). Prebuilt here:
#   (worktree) scripts/prebuild.sh gemm1-two-pass        -> /work/main/.xfer/pre-gemm1-two-pass
#   (worktree) git ls-files -z | xargs -0 cp --parents -t /work/main/.xfer/gemm1-two-pass
# On the device, from /work/main's root, carrying .xfer/pre-gemm1-two-pass and .xfer/gemm1-two-pass:
#   source scripts/use_prebuilt.sh gemm1-two-pass .xfer/gemm1-two-pass && OUT=$OUT bash .xfer/gemm1-two-pass/scripts/gpu_gemm1_two_pass.sh
# Steps: the new gtests (pass 2 vs the host reference; two-pass vs fused GEMM 1, exact and random; the staged
# backend with MEGAMOE_FP8_GEMM1_TWO_PASS=1 vs the CPU reference) and the staged / fused GEMM-1 tests they sit
# beside; bench gemm dsv3 + qwen3-30b at 512 / 1024 / 4096 rows per expert with --gemm1-two-pass both. Last a table.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
[ -n "${PREBUILT:-}" ] || source scripts/use_prebuilt.sh gemm1-two-pass .xfer/gemm1-two-pass >/dev/null || exit 1
B=$PREBUILT; T=$B/tests
budget_s=145; pack_name=gemm1_two_pass.tgz
source scripts/device_steps.sh
step test_two_pass 60 "$T/megamoe_tests_gpu" \
  --gtest_filter='SwigluQuantFp8.*:GroupedGemmFp8.Gemm1TwoPass*:EpSingle.StagedGemm1TwoPass*:EpSingle.StagedMatchesReference:GroupedGemmFp8.Gemm1ExactInputsMatchDeviceArithmetic'
grep -hE "swiglu_quant |two-pass" "$logs/test_two_pass.log" | head -40
step bench 80 "$B/megamoe" bench gemm --format fp8 --models dsv3 qwen3-30b --rows 512 1024 4096 \
  --gemm1-two-pass both --json "$logs/bench.json"
cp "$logs/bench.json" "$out/" 2>/dev/null
print_test_counts
python3 - "$logs/bench.json" <<'PY'
import json, sys
try: rows = json.load(open(sys.argv[1]))
except Exception as e: sys.exit("no bench JSON: %s" % e)
print("\n%-10s %5s | %9s %9s %7s | %9s %9s %8s | %9s" % ("model", "rows", "fused_us", "2pass_us", "speedup",
      "gemm_us", "swiglu_us", "swGB/s", "cuBLASfp8"))
for r in rows:
    if r["gemm"] != "gemm1" or "two_pass_us" not in r: continue
    print("%-10s %5d | %9.1f %9.1f %7.3f | %9.1f %9.1f %8.0f | %9.1f" % (r["model"], r["rows_per_expert"], r["us"],
          r["two_pass_us"], r["us"] / r["two_pass_us"], r["two_pass_gemm_us"], r["two_pass_swiglu_us"],
          r["two_pass_swiglu_gbps"], r.get("cublas_fp8_us", 0)))
PY
print_summary
pack
