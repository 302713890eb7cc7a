#!/usr/bin/env bash
# One device call (one H200, ~60 s, prebuilt main): why FP8 GEMM 1 at 33-63 rows per expert runs ~8% slower than
# at 64 (docs/perf.md session 11 call 8: dsv3 268.6 vs 248.0 µs at 48 rows, qwen3-30b 61.7 vs 48.5), while GEMM 2
# grows monotonically. Sweeps the rows (every tile holds <= 64 rows: the 64 x 256 split-N kernel, the balanced
# epilogue above 32 rows) with the spread epilogue off and on, and the rows hint pinned to 64 at 48 rows (the
# same tiles, hint-independent kernel choice), then ncu's per-kernel summary at 48 and 64 rows.
#   source scripts/use_prebuilt.sh main && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_fp8_rows_sweep.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
B=${PREBUILT:?source scripts/use_prebuilt.sh main first}
for s in 0 1; do
  MEGAMOE_SWIGLU_SPREAD=$s timeout 40 "$B/megamoe" bench gemm --format fp8 --models dsv3 qwen3-30b \
    --rows 32 40 48 56 60 63 64 --no-cublas --json "$out/sweep_$s.json" >/dev/null 2>&1 || echo "sweep $s failed"
done
timeout 20 "$B/megamoe" bench gemm --format fp8 --models dsv3 --rows 48 --rows-hint 64 --no-cublas \
  --json "$out/hint64.json" >/dev/null 2>&1 || echo "hint run failed"
ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for rows in 48 64; do
  timeout 60 "$ncu_bin" --clock-control none --kernel-name regex:fp8_grouped --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters -o "$out/ncu_r$rows" \
    "$B/megamoe" bench gemm --format fp8 --models dsv3 --rows $rows --repeats 2 --no-cublas >/dev/null 2>&1
  "$ncu_bin" --import "$out/ncu_r$rows.ncu-rep" --page details --print-units base >"$out/ncu_r$rows.txt" 2>&1
  "$ncu_bin" --import "$out/ncu_r$rows.ncu-rep" --page source --print-source sass --csv | gzip >"$out/ncu_r$rows.sass.csv.gz"
  rm -f "$out/ncu_r$rows.ncu-rep"
done
python3 - "$out" <<'PY'
import json, os, sys
d = sys.argv[1]
for name in ("sweep_0", "sweep_1", "hint64"):
    p = os.path.join(d, name + ".json")
    if not os.path.exists(p): continue
    print(name, " ".join("%s/%d/%s %.1f" % (r["model"], r["rows_per_expert"], r["gemm"], r["us"]) for r in json.load(open(p))))
PY
grep -hE "sm90_|Duration|Warp Cycles Per Issued|Issue Slots Busy" "$out"/ncu_r*.txt | head -12
