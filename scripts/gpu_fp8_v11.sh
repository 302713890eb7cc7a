#!/usr/bin/env bash
# One device call (one H200, <= 200 s, prebuilt fp8-v11): the v11 FP8 GEMM-2 kernel (docs/grouped_gemm.md "v11",
# src/kernels/sm90_fp8_wide_grouped_gemm.cuh). (1) its gtests (bit-identical to the v8-v10 kernel, fp64 reference);
# (2) bench gemm old vs v11 side by side per point, at BN 128 and 192; (3) ncu SpeedOfLight + WarpStateStats +
# SourceCounters of v11 (BN 192) at dsv3 GEMM 2, 1024 rows per expert; (4) a table: old vs v11 TFLOP/s per point.
#   source scripts/use_prebuilt.sh fp8-v11 .xfer/fp8-v11 && PREBUILT=$PREBUILT OUT=$OUT bash .xfer/fp8-v11/scripts/gpu_fp8_v11.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
B=${PREBUILT:?source scripts/use_prebuilt.sh fp8-v11 .xfer/fp8-v11 first}
timeout 70 "$B/tests/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.V11*:GroupedGemmFp8.PlainBitExactSmallIntegers' \
  >"$out/gtest_v11.txt" 2>&1
echo "gtest rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/gtest_v11.txt" | tr '\n' ' ')"
grep -E "FAILED|Failure" "$out/gtest_v11.txt" | head -8
for bn in 128 192; do
  timeout 50 "$B/megamoe" bench gemm --format fp8 --models dsv3 qwen3-30b ms4 --rows 512 1024 4096 --experts 32 \
    --fp8-v11 both --v11-bn $bn --no-cublas --repeats 20 --json "$out/bench_bn$bn.json" >"$out/bench_bn$bn.txt" 2>&1 \
    || echo "bench bn $bn failed (rc $?): $(tail -2 "$out/bench_bn$bn.txt")"
done
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ]; then
  for bn in 192 128; do
    MEGAMOE_FP8_GEMM_V11=1 MEGAMOE_FP8_GEMM_V11_BN=$bn timeout 30 "$ncu_bin" --clock-control none \
      --kernel-name regex:fp8_wide_grouped --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section SourceCounters -o "$out/ncu_v11_bn$bn" \
      "$B/megamoe" bench gemm --format fp8 --models dsv3 --rows 1024 --experts 32 --repeats 2 --no-cublas >/dev/null 2>&1
    "$ncu_bin" --import "$out/ncu_v11_bn$bn.ncu-rep" --page details --print-units base >"$out/ncu_v11_bn$bn.txt" 2>&1
    "$ncu_bin" --import "$out/ncu_v11_bn$bn.ncu-rep" --page source --print-source sass --csv 2>/dev/null |
      gzip >"$out/ncu_v11_bn$bn.sass.csv.gz"
    rm -f "$out/ncu_v11_bn$bn.ncu-rep"
    echo "ncu v11 BN $bn (dsv3 gemm2 1024 rows):"
    grep -hE "^ +(Duration|Executed Instructions|Warp Cycles Per Issued Instruction|Issue Slots Busy|Compute \(SM\) Throughput) " \
      "$out/ncu_v11_bn$bn.txt" | head -6
  done
fi
# memcheck of the v11 kernel on small exact problems (both widths; several experts, partial tiles)
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$cs" ]; then
  timeout 60 "$cs" --tool memcheck --report-api-errors no --error-exitcode 1 "$B/tests/megamoe_tests_gpu" \
    --gtest_filter='GroupedGemmFp8.V11BitExactSmallIntegers' >"$out/memcheck_v11.txt" 2>&1
  echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY' "$out/memcheck_v11.txt" | tail -1)"
fi
python3 - "$out" <<'PY'
import json, os, sys
d = sys.argv[1]
print("%-10s %5s %5s | %4s %9s %9s | %9s %9s %6s" % ("model", "rows", "gemm", "BN", "old_us", "v11_us", "old_TF", "v11_TF", "x"))
for bn in (128, 192):
    p = os.path.join(d, "bench_bn%d.json" % bn)
    if not os.path.exists(p): print("no", p); continue
    for r in json.load(open(p)):
        if r["gemm"] != "gemm2" or "v11_us" not in r: continue
        print("%-10s %5d %5s | %4d %9.1f %9.1f | %9.1f %9.1f %6.3f" % (r["model"], r["rows_per_expert"], r["gemm"], bn,
              r["us"], r["v11_us"], r["tflops"], r["v11_tflops"], r["us"] / r["v11_us"]))
PY
