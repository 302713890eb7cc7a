#!/usr/bin/env bash
# One device call for the v7 GEMM-1 epilogue (docs/grouped_gemm.md, v7): tests of the new binaries and
# old-vs-new benchmarks, binaries compiled HERE (scripts/prebuild.sh main / gemm-epilogue). Run from
# the root of the shipped checkout, carrying .xfer/pre-main, .xfer/pre-gemm-epilogue and
# .xfer/gemm-epilogue:
#   OUT=$OUT bash .xfer/gemm-epilogue/scripts/gpu_gemm_epilogue.sh
# .xfer/pre-gemm-epilogue/variant-a/libmegamoe.so (optional): the library with step A only (balanced
# epilogue, no descriptor hoisting); the new `megamoe` runs against it through LD_LIBRARY_PATH.
# Layout in time (BUDGET seconds, default 185 for a `run` with timeout_s 195; a step that would not
# fit is skipped and says so; BUDGET=110 keeps the tests and the GEMM benchmarks only):
#   GPU 0: GroupedGemmFp8.* + MegaSingle.* (new; GEMM-1 outputs dumped for the old/new compare)
#   GPU 1: bench gemm old, new, [A], old, new; then the GEMM-1 tests of the new test binary against
#          main's libmegamoe.so (dump), then MegaMulti.* (both GPUs, correctness only)
#   then, GPUs quiet: bench layer old, new.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"
t0=$(date +%s); budget=${BUDGET:-185}
left() { echo $(( budget - ($(date +%s) - t0) )); }
source scripts/use_prebuilt.sh main >"$out/prebuilt_old.txt" 2>&1 || { cat "$out/prebuilt_old.txt"; exit 1; }
old=$PREBUILT
source scripts/use_prebuilt.sh gemm-epilogue .xfer/gemm-epilogue >"$out/prebuilt_new.txt" 2>&1 || { cat "$out/prebuilt_new.txt"; exit 1; }
new=$PREBUILT
cat "$out/prebuilt_old.txt" "$out/prebuilt_new.txt" | grep prebuilt
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader | tee "$out/gpus.txt"
models=(dsv3 ms4 qwen3-30b); rows=(128 1024 4096)

mkdir -p "$out/dump_new" "$out/dump_old"
( CUDA_VISIBLE_DEVICES=0 MEGAMOE_TEST_GEMM1_DUMP="$out/dump_new" timeout $(( budget - 10 < 150 ? budget - 10 : 150 )) \
    "$new/tests/megamoe_tests_gpu" \
    --gtest_filter='GroupedGemmFp8.*:MegaSingle.*' --gtest_brief=1 >"$out/test_gpu.log" 2>&1
  echo "test_gpu rc=$? $(( $(date +%s) - t0 ))s" >>"$out/steps.txt" ) &
gpu_tests=$!

gemm() {  # gemm TAG BINARY [LIBDIR]
  local tag=$1 bin=$2 lib=${3:-}
  [ "$(left)" -gt 60 ] || { echo "bench_gemm_$tag skipped (time)" >>"$out/steps.txt"; return; }
  CUDA_VISIBLE_DEVICES=1 LD_LIBRARY_PATH="${lib:+$lib:}$LD_LIBRARY_PATH" timeout 45 "$bin/megamoe" bench gemm \
    --models "${models[@]}" --rows "${rows[@]}" --json "$out/$tag.json" >"$out/bench_gemm_$tag.log" 2>&1
  echo "bench_gemm_$tag rc=$? $(( $(date +%s) - t0 ))s" >>"$out/steps.txt"
}
gemm old "$old"; gemm new "$new"
[ -f "$new/variant-a/libmegamoe.so" ] && gemm a "$new" "$new/variant-a"
gemm old2 "$old"; gemm new2 "$new"

# The new test binary against main's library: same tests, outputs of the old kernel (bit-identity on
# random inputs; the device-arithmetic tests also run against the old kernel).
if [ "$(left)" -gt 70 ]; then
  CUDA_VISIBLE_DEVICES=1 LD_LIBRARY_PATH="$old:$LD_LIBRARY_PATH" MEGAMOE_TEST_GEMM1_DUMP="$out/dump_old" timeout 60 \
    "$new/tests/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.Gemm1*:GroupedGemmFp8.ScheduleVariantsGemm1*' \
    --gtest_brief=1 >"$out/test_gpu_oldlib.log" 2>&1
  echo "test_gpu_oldlib rc=$? $(( $(date +%s) - t0 ))s" >>"$out/steps.txt"
fi
if [ "$(left)" -gt 40 ]; then
  timeout $(( $(left) < 90 ? $(left) - 10 : 90 )) "$new/tests/megamoe_tests_multigpu" --gtest_filter='MegaMulti.*' \
    --gtest_brief=1 >"$out/test_multigpu.log" 2>&1
  echo "test_multigpu rc=$? $(( $(date +%s) - t0 ))s" >>"$out/steps.txt"
else
  echo "test_multigpu skipped (time)" >>"$out/steps.txt"
fi
wait "$gpu_tests"

layer() {  # layer TAG BINARY
  [ "$(left)" -gt 35 ] || { echo "bench_layer_$1 skipped (time)" >>"$out/steps.txt"; return; }
  timeout $(( $(left) - 5 < 60 ? $(left) - 5 : 60 )) "$2/megamoe" bench layer --backend staged,mega --ranks 2 \
    --preset dsv3 --format fp8_block --tokens 128,2048,8192 --iters 5 --json "$out/layer_$1.json" >"$out/bench_layer_$1.log" 2>&1
  echo "bench_layer_$1 rc=$? $(( $(date +%s) - t0 ))s" >>"$out/steps.txt"
}
layer old "$old"; layer new "$new"

echo "== failures / summaries"
grep -h -E "^\[  (FAILED|PASSED) |FAILED TEST|tests ran|Failure|device arithmetic" "$out"/test_*.log | sort | uniq -c | head -40
echo "== old vs new GEMM-1 outputs on identical inputs (dump files)"
same=0; differ=0
for f in "$out"/dump_new/*.bin; do
  g="$out/dump_old/$(basename "$f")"; [ -f "$g" ] || continue
  if cmp -s "$f" "$g"; then same=$((same + 1)); else differ=$((differ + 1)); echo "DIFFER $(basename "$f")"; fi
done
echo "dump files identical: $same, different: $differ"
echo "== steps"; cat "$out/steps.txt"
python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
def load(tag):
    p = os.path.join(out, tag + ".json")
    if not os.path.exists(p): return {}
    return {(r["model"], r["gemm"], r["rows_per_expert"]): r for r in json.load(open(p))}
runs = {t: load(t) for t in ["old", "new", "a", "old2", "new2"]}
keys = sorted(runs["old"] or runs["new"], key=lambda k: (k[0], k[1], k[2]))
print("\n%-10s %-5s %5s | %7s %7s %7s %7s %7s | %6s | %7s" % ("model", "gemm", "rows", "old", "new", "A-only", "old2", "new2", "new/old", "cuBLAS"))
for k in keys:
    tf = [runs[t].get(k, {}).get("tflops", float("nan")) for t in ["old", "new", "a", "old2", "new2"]]
    o = [x for x in (tf[0], tf[3]) if x == x]; n = [x for x in (tf[1], tf[4]) if x == x]
    ratio = (sum(n) / len(n)) / (sum(o) / len(o)) if o and n else float("nan")
    cub = runs["new"].get(k, {}).get("cublas_fp8_tflops", float("nan"))
    print("%-10s %-5s %5d | %7.0f %7.0f %7.0f %7.0f %7.0f | %6.3f | %7.0f" % (k[0], k[1], k[2], *tf, ratio, cub))
layer = {}
for tag in ["old", "new"]:
    p = os.path.join(out, "layer_%s.json" % tag)
    if os.path.exists(p):
        for c in json.load(open(p)).get("cases", []):
            layer.setdefault((c["backend"], c["tokens"]), {})[tag] = c["median_us"]
if layer:
    print("\n%-8s %6s | %9s %9s | %6s" % ("backend", "tokens", "old_us", "new_us", "new/old"))
for (backend, tokens), v in sorted(layer.items()):
    o, n = v.get("old", float("nan")), v.get("new", float("nan"))
    print("%-8s %6d | %9.0f %9.0f | %6.3f" % (backend, tokens, o, n, n / o))
EOF
