#!/usr/bin/env bash
# One device call for the v8 BF16 bulk-store epilogue (docs/grouped_gemm.md, v8): tests of the new
# binaries and old-vs-new GEMM benchmarks, binaries compiled HERE (scripts/prebuild.sh main /
# gemm-bf16-store). Run from the root of the shipped checkout on nvidia-h200-x2, carrying
# .xfer/pre-main, .xfer/pre-gemm-bf16-store and .xfer/gemm-bf16-store (run timeout_s 240):
#   OUT=$OUT bash .xfer/gemm-bf16-store/scripts/gpu_gemm_bf16_store.sh
#   GPU 0: the plain (BF16-out) GroupedGemmFp8 tests, then compute-sanitizer memcheck of the new ones
#   GPU 1: bench gemm old, new, old, new (dsv3, ms4, qwen3-30b at 128 / 1024 / 4096 rows per expert)
# Only kStoreBf16 changed: GEMM-1 (SwiGLU), the BF16 kernel and the fused kernel compile to the same code.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
t0=$(date +%s)
source scripts/use_prebuilt.sh main >"$out/prebuilt_old.txt" 2>&1 || { cat "$out/prebuilt_old.txt"; exit 1; }
old=$PREBUILT
source scripts/use_prebuilt.sh gemm-bf16-store .xfer/gemm-bf16-store >"$out/prebuilt_new.txt" 2>&1 ||
  { cat "$out/prebuilt_new.txt"; exit 1; }
new=$PREBUILT
cat "$out/prebuilt_old.txt" "$out/prebuilt_new.txt" | grep prebuilt
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

( CUDA_VISIBLE_DEVICES=0 timeout 140 "$new/tests/megamoe_tests_gpu" \
    --gtest_filter='GroupedGemmFp8.Plain*:GroupedGemmFp8.ScheduleVariantsPlainAllTiles:GroupedGemmFp8.Rejects*' \
    --gtest_brief=1 >"$out/test_gpu.log" 2>&1
  echo "test_gpu rc=$? $(( $(date +%s) - t0 ))s" >>"$out/steps.txt"
  CUDA_VISIBLE_DEVICES=0 timeout 80 "$sanitizer" --tool memcheck --error-exitcode 3 "$new/tests/megamoe_tests_gpu" \
    --gtest_filter='GroupedGemmFp8.PlainBulkStore*:GroupedGemmFp8.PlainSplitNSmallGroups' --gtest_brief=1 \
    >"$out/test_memcheck.log" 2>&1
  echo "test_memcheck rc=$? $(( $(date +%s) - t0 ))s" >>"$out/steps.txt" ) &
tests=$!

for tag in old new old2 new2; do
  bin=$old; [[ $tag == new* ]] && bin=$new
  CUDA_VISIBLE_DEVICES=1 timeout 45 "$bin/megamoe" bench gemm --models dsv3 ms4 qwen3-30b --rows 128 1024 4096 \
    --json "$out/$tag.json" >"$out/bench_gemm_$tag.log" 2>&1
  echo "bench_gemm_$tag rc=$? $(( $(date +%s) - t0 ))s" >>"$out/steps.txt"
done
wait "$tests"

echo "== failures / summaries"
grep -h -E "^\[  (FAILED|PASSED) |FAILED TEST|tests ran|Failure|ERROR SUMMARY" "$out"/test_*.log | sort | uniq -c | head -40
echo "== steps"; cat "$out/steps.txt"
python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(tag):
    p = os.path.join(out, tag + ".json")
    if not os.path.exists(p): return {}
    return {(r["model"], r["gemm"], r["rows_per_expert"]): r for r in json.load(open(p))}
runs = {t: load(t) for t in ["old", "new", "old2", "new2"]}
keys = sorted(runs["old"] or runs["new"], key=lambda k: (k[0], k[1], k[2]))
print("\n%-10s %-5s %5s | %7s %7s %7s %7s | %7s | %7s" % ("model", "gemm", "rows", "old", "new", "old2", "new2", "new/old", "cuBLAS"))
for k in keys:
    tf = [runs[t].get(k, {}).get("tflops", float("nan")) for t in ["old", "new", "old2", "new2"]]
    o = [x for x in (tf[0], tf[2]) if x == x]; n = [x for x in (tf[1], tf[3]) if x == x]
    ratio = (sum(n) / len(n)) / (sum(o) / len(o)) if o and n else float("nan")
    cub = runs["new"].get(k, {}).get("cublas_fp8_tflops", float("nan"))
    print("%-10s %-5s %5d | %7.0f %7.0f %7.0f %7.0f | %7.3f | %7.0f" % (k[0], k[1], k[2], *tf, ratio, cub))
EOF
