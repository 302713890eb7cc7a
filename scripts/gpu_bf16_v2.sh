#!/usr/bin/env bash
# One device call (1 x H200, ~240 s) that verifies branch bf16-v2 (docs/grouped_gemm.md "BF16 v2": wide
# 128 x 256 tiles with wgmma m64n256k16, bulk-store epilogues, GEMM 1 on gate/up-interleaved-by-8 BF16
# weights) and measures it against v1 side by side. Prebuilt by scripts/prebuild.sh bf16-v2, its tracked
# files copied to .xfer/bf16-v2; carry both; run from the shipped checkout's root:
#   OUT=$OUT bash .xfer/bf16-v2/scripts/gpu_bf16_v2.sh
# Steps: GroupedGemmBf16.* (v2 vs reference and bit-identical to v1), `megamoe bench gemm --format bf16
# --bf16-v2 both` for dsv3 and qwen3-30b at 1024 / 4096 rows per expert (v1 main columns, v2 right after
# it, cuBLAS BF16 in the same run; also 32 / 128 rows: the small-group risk of v2 GEMM 1), compute-sanitizer memcheck of GroupedGemmBf16.V2SanitizerSmall, the
# staged / mega BF16 tests the packing change touches; a table last.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/use_prebuilt.sh" bf16-v2 "$here" >/dev/null || exit 1
B=$PREBUILT; T=$B/tests; summary=(); start=$(date +%s)
pack() { tar -czf "$out/bf16_v2.tgz" -C "$logs" . 2>/dev/null; }
step() {
  local name=$1 limit=$2; shift 2; local t0=$(date +%s) rc=0 left=$(( 240 - ($(date +%s) - start) ))
  [ "$left" -lt 15 ] && { summary+=("$name|skipped|-"); return 1; }
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  summary+=("$name|$([ $rc -eq 0 ] && echo ok || echo "FAIL($rc)")|$(( $(date +%s) - t0 ))s")
  [ $rc -ne 0 ] && grep -E "FAILED|Failure|rror" "$logs/$name.log" | head -10
  pack; return $rc
}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv >"$logs/gpu.txt" 2>&1
step test_bf16 60 "$T/megamoe_tests_gpu" --gtest_filter='GroupedGemmBf16.*'
step bench 75 "$B/megamoe" bench gemm --format bf16 --bf16-v2 both --models dsv3 qwen3-30b --rows 32 128 1024 4096 \
  --repeats 10 --json "$logs/bench_bf16_v2.json"
step memcheck 45 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$T/megamoe_tests_gpu" \
  --gtest_filter='GroupedGemmBf16.V2SanitizerSmall'
step test_staged_mega 60 "$T/megamoe_tests_gpu" \
  --gtest_filter='EpSingle.StagedMatchesReference:MegaSingle.*/bf16:StagedPhaseTiming.*:MoeWorkspaceSplit.*'
grep -hE "^\[  (PASSED|FAILED) " "$logs"/test_*.log "$logs"/memcheck.log 2>/dev/null | sort | uniq -c
grep -hE "ERROR SUMMARY" "$logs/memcheck.log" 2>/dev/null
python3 - "$logs/bench_bf16_v2.json" <<'PY'
import json, os, sys
p = sys.argv[1]
if not os.path.exists(p):
    print("no bench JSON (killed?); bench.log:")
    print(open(os.path.join(os.path.dirname(p), "bench.log")).read()[-3000:])
    sys.exit(0)
rows = json.load(open(p))
print("\n%-10s %5s %5s | %8s %8s %6s | %8s | %6s %6s" % ("model", "rows", "gemm", "v1 TF/s", "v2 TF/s", "v2/v1",
                                                      "cuBLAS", "v1/cuB", "v2/cuB"))
for r in rows:
    v1, v2, cb = r["tflops"], r.get("v2_tflops", 0.0), r.get("cublas_bf16_tflops", 0.0)
    print("%-10s %5d %5s | %8.1f %8.1f %6.3f | %8.1f | %6.2f %6.2f" % (
        r["model"], r["rows_per_expert"], r["gemm"], v1, v2, v2 / v1 if v1 else 0, cb,
        v1 / cb if cb else 0, v2 / cb if cb else 0))
PY
printf '\n%-20s %-12s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-20s %-12s %s\n' "$a" "$b" "$c"; done
pack
