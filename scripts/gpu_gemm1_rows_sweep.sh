#!/usr/bin/env bash
# Does FP8 GEMM 1's time follow the m-tile count? (session 20 call 6, docs/perf.md "Session 20"): bench gemm GEMM 1
# fp8 v11, dsv3, 128 experts, EXACT rows per expert just below / above multiples of 128, clusters on (the default, 2)
# and off (1-CTA); prints µs, TFLOP/s and µs per m-tile. One H200, ~40 s.
#   source scripts/use_prebuilt.sh NAME && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_gemm1_rows_sweep.sh
B=${PREBUILT:?}; out=${OUT:-out}
for c in 1 0; do
  MEGAMOE_GEMM_CLUSTER=$c timeout 60 "$B/megamoe" bench gemm --gemms 1 --format fp8 --gemm1-v9 on --gemm1-v11 on \
    --models dsv3 --experts 128 --rows 384 392 448 456 512 520 576 640 --rows-spread none --no-cublas --repeats 10 \
    --json "$out/rows_sweep_c$c.json" > "$out/rows_sweep_c$c.log" 2>&1
  echo "cluster=$c rc=$?"
done
python3 - "$out" <<'PY'
import json, sys, os
d = sys.argv[1]
print("GEMM 1 dsv3 fp8 v11, 128 experts, exact rows: us, TFLOP/s, m-tiles per expert, us per m-tile")
for c in ("1", "0"):
    try: recs = json.load(open(os.path.join(d, "rows_sweep_c%s.json" % c)))
    except Exception as e: print(c, e); continue
    for r in recs:
        if r.get("gemm") != "gemm1": continue
        rows = r["rows_per_expert"]; t = (rows + 127) // 128
        flop = 2.0 * rows * r["experts"] * r["n"] * r["k"]
        print("cluster %s rows %4d | %8.1f us | %6.0f TF | m-tiles %d | %7.1f us per m-tile" % (c, rows, r["us"], flop / r["us"] * 1e-6, t, r["us"] / t))
PY
