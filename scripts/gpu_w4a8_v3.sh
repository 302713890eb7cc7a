#!/usr/bin/env bash
# One device call (2 x H200) for W4A8 v3 (docs/grouped_gemm.md "W4A8 v3"): the one-GPU suite (sharded
# over both GPUs), synccheck + memcheck of the W4A8 GEMM-1 epilogue's per-pair barriers, the 2-rank W4A8
# mega tests, and v2 vs v3 side by side: bench gemm nvfp4 / mxfp4 (v2 then v3 on GPU 0, v3 then v2 on
# GPU 1) and bench layer dsv3 nvfp4.
#   scripts/prebuild.sh main; old binaries in .xfer/old-w4a8v2.tgz (libmegamoe.so + megamoe of v2);
#   carry .xfer/pre-main and .xfer/old-w4a8v2.tgz;
#   source scripts/use_prebuilt.sh main && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_w4a8_v3.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; T=$B/tests
old=/tmp/w4a8v2; mkdir -p "$old" && tar -xzf .xfer/old-w4a8v2.tgz -C "$old"
# v2's megamoe has RUNPATH = the v3 build directory: LD_LIBRARY_PATH (searched first) gives it its own library.
run_old() { env LD_LIBRARY_PATH="$old:${LD_LIBRARY_PATH:-}" "$old/megamoe" "$@"; }
run_new() { "$B/megamoe" "$@"; }
export -f run_old run_new; export old B
deadline=${DEADLINE_S:-560}; start=$(date +%s); summary=()
pack() { tar -czf "$out/w4a8_v3.tgz" -C "$logs" . 2>/dev/null; }
step() {  # step NAME LIMIT command...
  local name=$1 limit=$2; shift 2; local t0 rc=0 l; t0=$(date +%s); l=$(( deadline - (t0 - start) ))
  if [ "$l" -lt 15 ]; then summary+=("$name|skipped (deadline)|-"); return 1; fi
  [ "$limit" -gt "$l" ] && limit=$l
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($rc)|$(( $(date +%s) - t0 ))s"); grep -E "FAILED|Failure|rror" "$logs/$name.log" | head -8; fi
  pack; return $rc
}
step test_gpu 200 bash -c 'pids=(); rc=0; for i in 0 1; do
    CUDA_VISIBLE_DEVICES=$i GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i "$0" >"$1.$i" 2>&1 & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done; cat "$1".*; exit $rc' "$T/megamoe_tests_gpu" "$logs/test_gpu_shard"
step w4a8_sanitize 150 bash -c 'CUDA_VISIBLE_DEVICES=0 compute-sanitizer --tool synccheck --error-exitcode 1 "$0" \
    --gtest_filter=GroupedGemmW4a8.Gemm1SiluTopk:GroupedGemmW4a8.Gemm1ExactInputs & a=$!
  CUDA_VISIBLE_DEVICES=1 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$0" \
    --gtest_filter=GroupedGemmW4a8.PlainRandomShapes:GroupedGemmW4a8.Gemm1SwigluClampedNoTopk & b=$!
  wait $a; ra=$?; wait $b; rb=$?; echo "synccheck rc=$ra memcheck rc=$rb"; exit $(( ra | rb ))' "$T/megamoe_tests_gpu"
step bench_gemm 120 bash -c 'rows="8 32 128 1024 4096"
  for fmt in nvfp4 mxfp4; do
    ( export CUDA_VISIBLE_DEVICES=0
      run_old bench gemm --no-cublas --format $fmt --models dsv3 qwen3-30b --rows $rows --json "$0/gemm_${fmt}_v2_gpu0.json" >"$0/gemm_${fmt}_v2_gpu0.txt"
      run_new bench gemm --no-cublas --format $fmt --models dsv3 qwen3-30b --rows $rows --json "$0/gemm_${fmt}_v3_gpu0.json" >"$0/gemm_${fmt}_v3_gpu0.txt" ) &
    ( export CUDA_VISIBLE_DEVICES=1
      run_new bench gemm --no-cublas --format $fmt --models dsv3 qwen3-30b --rows $rows --json "$0/gemm_${fmt}_v3_gpu1.json" >"$0/gemm_${fmt}_v3_gpu1.txt"
      run_old bench gemm --no-cublas --format $fmt --models dsv3 qwen3-30b --rows $rows --json "$0/gemm_${fmt}_v2_gpu1.json" >"$0/gemm_${fmt}_v2_gpu1.txt" ) &
    wait
  done' "$logs"
step test_multigpu_w4a8 170 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu" \
  --gtest_filter='MegaMulti.Nvfp4*:MegaMulti.Mxfp4*:MegaMulti.W4a8*:MegaMulti.StalledPeerTimesOutWithItsName'
for v in old new; do
  step "layer_nvfp4_$v" 80 bash -c "run_$v bench layer --backend staged,mega --ranks 2 --preset dsv3 --format nvfp4 \
    --tokens 128,2048 --iters 5 --json '$logs/layer_nvfp4_$v.json'"
done
grep -h -E "^\[  (PASSED|FAILED)  \]|ERROR SUMMARY" "$logs"/test_*.log "$logs"/w4a8_sanitize.log 2>/dev/null | sort | uniq -c
python3 - "$logs" <<'PY'
import json, sys, os
d = sys.argv[1]
def load(name):
    p = os.path.join(d, name)
    return {(c["model"], c["rows_per_expert"], c["gemm"]): c for c in json.load(open(p))} if os.path.exists(p) else {}
for fmt in ("nvfp4", "mxfp4"):
    v2 = [load("gemm_%s_v2_gpu%d.json" % (fmt, g)) for g in (0, 1)]
    v3 = [load("gemm_%s_v3_gpu%d.json" % (fmt, g)) for g in (0, 1)]
    print("== bench gemm %s: us v2 / v3 (GPU 0 | GPU 1), v3 / v2 speedup, v3 weight GB/s, v3 TFLOP/s" % fmt)
    for key in sorted(v3[0] or {}, key=lambda k: (k[0], k[1], k[2])):
        try:
            a = [v2[g][key]["us"] for g in (0, 1)]; b = [v3[g][key]["us"] for g in (0, 1)]
            print("  %-10s %5d %s  %8.1f / %8.1f | %8.1f / %8.1f   %.3f %.3f   %6.0f GB/s %6.0f TF" % (
                key[0], key[1], key[2], a[0], b[0], a[1], b[1], a[0] / b[0], a[1] / b[1],
                v3[0][key].get("weight_gbps", 0), v3[0][key].get("tflops", 0)))
        except (KeyError, IndexError, TypeError):
            pass
for v in ("old", "new"):
    p = os.path.join(d, "layer_nvfp4_%s.json" % v)
    if os.path.exists(p):
        j = json.load(open(p))
        print("== layer dsv3 nvfp4 %s: " % v + " | ".join("%s %d tok %.0f us (%.2fx floor)" % (
            c["backend"], c["tokens"], c["median_us"], c["ratio_to_floor"]) for c in j["cases"]))
PY
printf '\n%-22s %-20s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-22s %-20s %s\n' "$a" "$b" "$c"; done
pack
