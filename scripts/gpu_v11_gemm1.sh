#!/usr/bin/env bash
# One device call (one H200, <= 120 s, prebuilt v11-gemm1): v11 GEMM 1 (docs/grouped_gemm.md "v11 GEMM 1",
# sm90_fp8_wide_gemm1.cuh). (1) the GEMM-1 gtests (every run_gemm1 case also runs v11 with the TMA-scale switch
# off and on and requires v9's codes and scales bit for bit; Gemm1V11ManyTilesPerCta; the no-GPU rejection
# test); (2) bench gemm, v9 in the main column and v11 right after it per point (--gemm1-v9 on --gemm1-v11
# both), TMA scales on (default), then off; (3) a table, last: v9 vs v11 GEMM 1 µs / TFLOP/s.
#   source scripts/use_prebuilt.sh v11-gemm1 .xfer/v11-gemm1 && \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/v11-gemm1/scripts/gpu_v11_gemm1.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
B=${PREBUILT:?source scripts/use_prebuilt.sh v11-gemm1 .xfer/v11-gemm1 first}
filter='GroupedGemmFp8.Gemm1*:GroupedGemmFp8.ATailTrimOnAndOff'
filter+=':GroupedGemmFp8.ScheduleVariantsGemm1AllTiles:GroupedGemmFp8.RejectsBadGemm1Packing:-GroupedGemmFp8.Gemm1TwoPass*'
timeout 65 "$B/tests/megamoe_tests_gpu" --gtest_filter="$filter" >"$out/gtest_gemm1.txt" 2>&1
echo "gtest rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/gtest_gemm1.txt" | tr '\n' ' ')"
grep -E "FAILED|Failure" "$out/gtest_gemm1.txt" | head -8
echo "v11 vs v9 lines: $(grep -c 'gemm1 v11 (TMA scales' "$out/gtest_gemm1.txt"), with differences: \
$(grep 'gemm1 v11 (TMA scales' "$out/gtest_gemm1.txt" | grep -vc ': 0 /')"
i=0
for tma in 1 0; do
  i=$((i + 1))
  MEGAMOE_FP8_V11_TMA_SCALES=$tma timeout 20 "$B/megamoe" bench gemm --format fp8 --models dsv3 ms4 qwen3-30b \
    --rows 512 1024 4096 --experts 32 --gemm1-v9 on --gemm1-v11 both --no-cublas --repeats 20 \
    --json "$out/bench_${i}_tma$tma.json" >"$out/bench_${i}_tma$tma.txt" 2>&1 ||
    echo "bench $i (tma $tma) failed (rc $?): $(tail -2 "$out/bench_${i}_tma$tma.txt")"
done
python3 - "$out" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
runs = {}  # (model, rows) -> {"v9": [(us, tflops)], "v11_tma1": [...], "v11_tma0": [...]}
for p in sorted(glob.glob(os.path.join(d, "bench_*_tma*.json"))):
    tma = int(p.rsplit("tma", 1)[1].split(".")[0])
    for r in json.load(open(p)):
        if r.get("gemm") != "gemm1" or "v11_us" not in r: continue
        v = runs.setdefault((r["model"], r["rows_per_expert"]), {})
        v.setdefault("v9", []).append((r["us"], r["tflops"]))
        v.setdefault("v11_tma%d" % tma, []).append((r["v11_us"], r["v11_tflops"]))
def best(xs):
    return min(xs) if xs else (float("nan"), float("nan"))
print("%-10s %5s | %9s %7s | %9s %7s | %9s %7s | %6s %6s" % ("model", "rows", "v9_us", "TFLOP/s", "v11_us", "TFLOP/s",
      "v11_cpas", "TFLOP/s", "x_tma", "x_cpas"))
for (model, rows), v in sorted(runs.items()):
    a, t, c = best(v.get("v9", [])), best(v.get("v11_tma1", [])), best(v.get("v11_tma0", []))
    print("%-10s %5d | %9.1f %7.0f | %9.1f %7.0f | %9.1f %7.0f | %6.3f %6.3f" % (model, rows, a[0], a[1], t[0], t[1],
          c[0], c[1], a[0] / t[0], a[0] / c[0]))
print("GEMM 1, 32 experts, best of the runs; v11 = TMA A scales (K % 512 == 0: all three models), v11_cpas = the "
      "cp.async scale warp (MEGAMOE_FP8_V11_TMA_SCALES=0); x = v9 us / v11 us (> 1: v11 faster)")
PY
