#!/usr/bin/env bash
# One device call (ONE H200, <= 300 s): v11 GEMM 1 with A rows gathered through an index (GroupedGemm1Fp8Args::
# a_gather_rows, docs/grouped_gemm.md "v11 GEMM 1 gather"), the GEMM side of an EP dispatch that stores each token once
# per rank. Needs binaries prebuilt with docs/experiments/session26-gather.patch applied (NOT merged: docs/grouped_gemm.md
# "v11 GEMM 1 gather"). Everything is packed into $OUT/gemm1_gather.tgz after every step. Steps:
# (1) GroupedGemmFp8.Gemm1V11GatherMatchesContiguous (gathered = contiguous bit for bit, plain and clusters) and the v11
#     GEMM-1 regressions (Gemm1V11ManyTilesPerCta, V11ClusterMatchesNoCluster, Gemm1V11SmallTile).
# (2) compute-sanitizer memcheck of the gather test.
# (3) bench gemm --gemms 1, fp8, --gemm1-gather both (rows g1_contig / g1_gather / g1_contig2 / g1_gather2 per point),
#     MODELS (default "dsv3 ms4"), 128 experts, ROWS (default "256 512 2048") per expert, multinomial.
# (4) the table (gather / contiguous, both rounds).
# Knobs: EXTRA_FILTER (a gtest filter run after (1)), SKIP_TESTS=1 (bench only), GATHER_INDEX (both | identity),
# ARRIVALS (MEGAMOE_FP8_GEMM1_GATHER_ARRIVAL values, default "1 2"), GTEST_ARRIVAL (default 2), ROUNDS, MODELS, ROWS.
#   source scripts/use_prebuilt.sh NAME [SRC] && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_gemm1_gather.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}
budget_s=${BUDGET_S:-300}; pack_name=gemm1_gather.tgz
source "$(dirname "$0")/device_steps.sh"
export CUDA_VISIBLE_DEVICES=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
step gtest_gather 120 env MEGAMOE_FP8_GEMM1_GATHER_ARRIVAL=${GTEST_ARRIVAL:-2} "$B/tests/megamoe_tests_gpu" \
  --gtest_filter='GroupedGemmFp8.Gemm1V11Gather*:GroupedGemmFp8.Gemm1V11ManyTilesPerCta:GroupedGemmFp8.V11ClusterMatchesNoCluster:GroupedGemmFp8.Gemm1V11SmallTile'
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]|^gemm1 gather' "$logs/gtest_gather.log"
if [ -n "${EXTRA_FILTER:-}" ]; then
  step gtest_extra 150 "$B/tests/megamoe_tests_gpu" --gtest_filter="$EXTRA_FILTER"
  grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$logs/gtest_extra.log"
fi
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
step memcheck_gather 90 env MEGAMOE_FP8_GEMM1_GATHER_ARRIVAL=${GTEST_ARRIVAL:-2} "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 1 \
  "$B/tests/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.Gemm1V11Gather*'
grep -hE "ERROR SUMMARY|PASSED|FAILED" "$logs/memcheck_gather.log" | head -3
fi
for round in $(seq 1 "${ROUNDS:-2}"); do
  for arrival in ${ARRIVALS:-1 2}; do
    step "bench_gather_a${arrival}_r$round" 60 env MEGAMOE_FP8_GEMM1_GATHER_ARRIVAL=$arrival "$B/megamoe" bench gemm \
      --gemms 1 --format fp8 --gemm1-v9 on --gemm1-v11 on --gemm1-gather ${GATHER_INDEX:-both} --models ${MODELS:-dsv3 ms4} \
      --experts 128 --rows ${ROWS:-256 512 2048} --rows-spread multinomial --no-cublas --repeats 10 \
      --json "$logs/bench_gather_a${arrival}_r$round.json"
  done
done
pack
print_summary
python3 - "$logs" <<'PY'
import glob, json, os, re, sys
print("\nv11 GEMM 1, 128 experts, multinomial rows; median of 10 launches per row, A/B/A/B in one process per file")
print(f"{'file':24} {'model':6} {'rows':>5} | {'contig':>8} {'gather':>8} {'contig2':>8} {'gather2':>8} | gather/contig")
for p in sorted(glob.glob(os.path.join(sys.argv[1], "bench_gather*.json"))):
    try: records = json.load(open(p))
    except Exception as e: print(p, e); continue
    for r in records:
        s = {k[:-3]: v for k, v in r.items() if k.startswith("g1_") and k.endswith("_us")}
        if "g1_gather" not in s: continue
        c = min(s["g1_contig"], s["g1_contig2"]); g = min(s["g1_gather"], s["g1_gather2"])
        print(f"{os.path.basename(p)[:-5]:24} {r['model']:6} {r['rows_per_expert']:5} | {s['g1_contig']:8.1f} "
              f"{s['g1_gather']:8.1f} {s['g1_contig2']:8.1f} {s['g1_gather2']:8.1f} | {g / c:.3f}")
PY
