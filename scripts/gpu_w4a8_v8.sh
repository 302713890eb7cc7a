#!/usr/bin/env bash
# One device call (one H200, <= 150 s, prebuilt w4a8-v8): W4A8 v8 decode (docs/grouped_gemm.md "W4A8 v8 decode",
# src/kernels/sm90_fp4_decode.cuh decode_fp4_row_chunks_v8; MEGAMOE_W4A8_DECODE=old|v7|v8, default old).
# (1) the W4A8 gtests with MEGAMOE_W4A8_DECODE=v8 (GroupedGemmW4a8.*: every kernel against the fp64 references with
# the v8 decoder, and DecodeV8MatchesOldBitForBit: v8 vs old bit for bit on GEMM 1 and GEMM 2, nvfp4 / mxfp4,
# small-M and 2-warpgroup kernels, 1..1024 rows per expert, K 2048 / 7168, scales perturbed into the fallback;
# DecodeV7MatchesOldBitForBit is left out for time, it passed in session 14 call B).
# (2) bench gemm --format nvfp4 / mxfp4, dsv3 and qwen3-30b, 8 / 32 / 1024 rows per expert (32 experts), old vs v8 in
# alternating processes (the env switch is read once per process), three rounds. (4) below. (5) the table, last.
#   source scripts/use_prebuilt.sh w4a8-v8 .xfer/w4a8-v8 && \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/w4a8-v8/scripts/gpu_w4a8_v8.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh w4a8-v8 .xfer/w4a8-v8 first}
budget_s=145; pack_name=w4a8_v8.tgz
source "$(dirname "$0")/device_steps.sh"
step gtest_w4a8 80 env MEGAMOE_W4A8_DECODE=v8 "$B/tests/megamoe_tests_gpu" \
  --gtest_filter='GroupedGemmW4a8.*:-GroupedGemmW4a8.DecodeV7MatchesOldBitForBit'
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]|decode v8 vs old' "$logs/gtest_w4a8.log"
for round in 1 2 3; do
  for format in nvfp4 mxfp4; do
    for decode in old v8; do
      step "bench_${format}_${decode}_$round" 12 env MEGAMOE_W4A8_DECODE=$decode "$B/megamoe" bench gemm \
        --format "$format" --models dsv3 qwen3-30b --rows 8 32 1024 --no-cublas --repeats 10 \
        --json "$logs/bench_${format}_${decode}_$round.json"
    done
  done
done
# (4) with what is left: the fused kernel with v8 (mega[fused] and mega[split] == staged, 0 differing elements, both
# with v8; and vs the reference), nvfp4 and mxfp4.
step mega_fused_v8 40 env MEGAMOE_W4A8_DECODE=v8 "$B/tests/megamoe_tests_gpu" \
  --gtest_filter='MegaSingle.MatchesReferenceAndStagedReplaysAndRepeats/nvfp4:MegaSingle.MatchesReferenceAndStagedReplaysAndRepeats/mxfp4'
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$logs/mega_fused_v8.log" 2>/dev/null
cp "$logs"/*.json "$logs"/gtest_w4a8.log "$logs"/mega_fused_v8.log "$out/" 2>/dev/null
print_summary
python3 - "$logs" <<'PY'
import glob, json, os, sys
runs = {}  # (format, model, gemm, rows) -> {"old": [(us, tflops, gbps)], "v8": [...]}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*.json"))):
    decode = os.path.basename(p).split("_")[2]
    for r in json.load(open(p)):
        key = (r.get("format"), r["model"], r["gemm"], r["rows_per_expert"])
        runs.setdefault(key, {}).setdefault(decode, []).append((r["us"], r["tflops"], r["weight_gbps"]))
def best(xs):
    return min(xs) if xs else (float("nan"),) * 3
print("%-6s %-10s %-5s %5s | %9s %9s | %7s %7s | %7s %7s | %6s  (rounds v8/old)" % (
    "format", "model", "gemm", "rows", "old_us", "v8_us", "old_TBs", "v8_TBs", "old_TF", "v8_TF", "v8/old"))
for key, v in sorted(runs.items()):
    o, n = best(v.get("old", [])), best(v.get("v8", []))
    rounds = " ".join("%.3f" % (a[0] / b[0]) for a, b in zip(v.get("old", []), v.get("v8", [])))
    print("%-6s %-10s %-5s %5d | %9.1f %9.1f | %7.2f %7.2f | %7.0f %7.0f | %6.3f  (%s)" % (
        key[0], key[1], key[2], key[3], o[0], n[0], o[2] / 1000, n[2] / 1000, o[1], n[1], o[0] / n[0], rounds))
print("32 experts, best of 3 rounds (median of 10 launches each, L2 flushed); TB/s = FP4 weight stream (FP4 bytes + "
      "group scales + block records); v8/old = old us / v8 us (> 1: v8 faster)")
PY
