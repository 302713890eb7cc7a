#!/usr/bin/env bash
# One device call (ONE H200, <= 240 s, prebuilt w4a8-g1-small): the small-M kernel's kInterleaved8 mode (W4A8 GEMM 1
# on W13 packed kGateUpInterleaved8 at rows hints 1..64; docs/grouped_gemm.md "W4A8 small-M GEMM 1 on interleaved
# W13", src/kernels/sm90_w4a8_small_m_grouped_gemm.cuh). MEGAMOE_W4A8_G1_V10=1 makes `megamoe bench gemm` pack W13
# kGateUpInterleaved8 (at --rows 8..64 the hint is the rows, so the new mode runs); 0 (unset) = kGateUp, the old
# kernels (2-warpgroup spread kernel at <= 32 rows, old small-M at 64). Switch value 2 in the bench file names =
# interleaved with MEGAMOE_W4A8_SMALL_M=0, i.e. v10 GEMM 1 at these hints (what interleaved weights ran before).
# One binary, the switch read once per process: alternating processes. Everything packed into $OUT/w4a8_g1_small.tgz
# after every step. Budget-ordered:
# (1) GroupedGemmW4a8.W4a8V10Gemm1* (limit 90 s): the new W4a8V10Gemm1SmallMInterleavedMatchesOldBitForBit (new mode
#     vs BOTH old 64-row kernels on kGateUp, byte for byte, 128 launch pairs), ...SmallMInterleavedAgainstReference,
#     and the v10 GEMM 1 tests (unchanged kernel).
# (2) bench gemm --gemms 1, nvfp4 and mxfp4, dsv3 ms4 qwen3-30b, 32 experts, exact 8 16 32 64 rows, switch 0 / 1 / 2
#     in alternating processes, round 1.
# (3) compute-sanitizer memcheck of GroupedGemmW4a8.W4a8V10Gemm1SmallMInterleavedAgainstReference (limit 60 s).
# (4) bench round 2 (switch 0 / 1; what the budget leaves). (5) tables: TFLOP/s (bench_variant_table.py) and the
#     weight-stream GB/s (weight_gbps: FP4 bytes + group scales + block records per µs; issue 3's target >= 3.0 TB/s
#     at 8-32 rows).
#   source scripts/use_prebuilt.sh w4a8-g1-small .xfer/w4a8-g1-small && PREBUILT=$PREBUILT OUT=$OUT \
#     bash .xfer/w4a8-g1-small/scripts/gpu_w4a8_g1_small.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh w4a8-g1-small first}
budget_s=${BUDGET_S:-240}; pack_name=w4a8_g1_small.tgz
source "$(dirname "$0")/device_steps.sh"
T="$B/tests/megamoe_tests_gpu"
step test_g1 90 "$T" --gtest_filter='GroupedGemmW4a8.W4a8V10Gemm1*'
grep -hE "^\[  FAILED  \]|launch pairs" "$logs/test_g1.log" | sort -u | head -20
bench_round() {
  local round=$1 switches=$2 format v
  for format in ${FORMATS:-nvfp4 mxfp4}; do
    for v in $switches; do
      local g1=$v small=auto
      [ "$v" = 2 ] && { g1=1; small=0; }
      step "bench_${format}_v${v}_none_$round" 40 env MEGAMOE_W4A8_G1_V10=$g1 MEGAMOE_W4A8_SMALL_M=$small \
        "$B/megamoe" bench gemm --gemms 1 --format "$format" --models dsv3 ms4 qwen3-30b --rows 8 16 32 64 \
        --rows-spread none --no-cublas --repeats 10 --json "$logs/bench_${format}_v${v}_none_$round.json"
    done
  done
}
bench_round 1 "0 1 2"
step memcheck_g1 60 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$T" \
  --gtest_filter="${MEMCHECK_FILTER:-GroupedGemmW4a8.W4a8V10Gemm1SmallMInterleavedAgainstReference}"
tail -3 "$logs/memcheck_g1.log"
print_test_counts
bench_round 2 "0 1"
pack
print_summary
python3 "$(dirname "$0")/bench_variant_table.py" "$logs" g1small gemm1 old
# Weight-stream GB/s, best of the rounds per switch (0 old kGateUp, 1 the new mode, 2 v10 GEMM 1 on interleaved).
python3 - "$logs" <<'PY'
import glob, json, os, sys
best = {}
for p in glob.glob(os.path.join(sys.argv[1], "bench_*.json")):
    s = os.path.basename(p).split("_")[2][1:]
    try:
        rows = json.load(open(p))
    except (OSError, ValueError):
        continue
    for r in rows:
        if r["gemm"] != "gemm1":
            continue
        k = (r.get("format"), r["model"], r["rows_per_expert"])
        best.setdefault(k, {})[s] = max(best.get(k, {}).get(s, 0.0), r["weight_gbps"])
print("%-6s %-10s %5s | %9s %9s %9s  (weight GB/s: old kGateUp, new small-M interleaved, v10 GEMM 1 interleaved)"
      % ("format", "model", "rows", "old", "g1small", "v10g1"))
for k in sorted(best):
    v = best[k]
    print("%-6s %-10s %5d | %9.0f %9.0f %9.0f" % (k + tuple(v.get(s, float("nan")) for s in "012")))
PY
