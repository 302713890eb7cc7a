#!/usr/bin/env bash
# One device call (one H200, <= 90 s, prebuilt v11-tma-scales): the v11 FP8 GEMM-2 kernel's A scales by TMA
# (MEGAMOE_FP8_V11_TMA_SCALES=1; docs/grouped_gemm.md "v11 TMA scales"). (1) the v11 gtests (each v11 run with the
# switch off and on, bit-identical to the v8-v10 kernel; K % 512 == 0 takes the TMA path, other K the fallback);
# (2) bench gemm with v11 in the main column, switch 0 / 1 / 0 / 1; (3) a table: v11 µs cp.async vs TMA scales.
#   source scripts/use_prebuilt.sh v11-tma-scales .xfer/v11-tma-scales && \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/v11-tma-scales/scripts/gpu_v11_tma_scales.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
B=${PREBUILT:?source scripts/use_prebuilt.sh v11-tma-scales .xfer/v11-tma-scales first}
timeout 40 "$B/tests/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.V11*' >"$out/gtest_v11.txt" 2>&1
echo "gtest rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$out/gtest_v11.txt" | tr '\n' ' ')"
grep -E "FAILED|Failure" "$out/gtest_v11.txt" | head -8
i=0
for tma in 0 1 0 1; do
  i=$((i + 1))
  MEGAMOE_FP8_V11_TMA_SCALES=$tma timeout 20 "$B/megamoe" bench gemm --format fp8 --models dsv3 ms4 qwen3-30b \
    --rows 512 1024 4096 --experts 32 --fp8-v11 on --no-cublas --repeats 20 --json "$out/bench_${i}_tma$tma.json" \
    >"$out/bench_${i}_tma$tma.txt" 2>&1 || echo "bench $i (tma $tma) failed (rc $?): $(tail -2 "$out/bench_${i}_tma$tma.txt")"
done
python3 - "$out" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
runs = {}  # (model, rows) -> {tma: [us...]}
for p in sorted(glob.glob(os.path.join(d, "bench_*_tma*.json"))):
    tma = int(p.rsplit("tma", 1)[1].split(".")[0])
    for r in json.load(open(p)):
        if r.get("gemm") != "gemm2": continue
        runs.setdefault((r["model"], r["rows_per_expert"]), {}).setdefault(tma, []).append(r["us"])
print("%-10s %5s | %-15s %-15s | %6s" % ("model", "rows", "cp.async_us", "tma_us", "x"))
for (model, rows), v in sorted(runs.items()):
    a, t = v.get(0, []), v.get(1, [])
    fa = "/".join("%.1f" % x for x in a); ft = "/".join("%.1f" % x for x in t)
    x = (min(a) / min(t)) if a and t else float("nan")
    print("%-10s %5d | %-15s %-15s | %6.3f" % (model, rows, fa, ft, x))
print("x = best cp.async / best TMA (> 1: TMA scales faster); v11 BN 192 (default), 32 experts, GEMM 2")
PY
