#!/usr/bin/env bash
# One device call (2 x H200) for W4A8 v4 (the small-M kernel) and the mbarrier suspend hint
# (docs/grouped_gemm.md "W4A8 v4"), old = v3 binaries (.xfer/old-v3.tgz: libmegamoe.so + megamoe), new =
# .xfer/pre-main:
#   carry .xfer/pre-main and .xfer/old-v3.tgz;
#   source scripts/use_prebuilt.sh main && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_w4a8_v4.sh
# Steps: the one-GPU suite (sharded over both GPUs); synccheck + memcheck of the small-M kernel; bench gemm
# W4A8 old / new / new with MEGAMOE_W4A8_SMALL_M=0 (GPU 0) beside FP8 old / new (GPU 1); the 2-rank
# EpMulti + MegaMulti suites; bench layer dsv3 FP8 old / new and nvfp4 (new with --mega-path both, old).
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; T=$B/tests
old=/tmp/w4a8v3; mkdir -p "$old" && tar -xzf .xfer/old-v3.tgz -C "$old"
# The old megamoe has RUNPATH = the new build directory: LD_LIBRARY_PATH (searched first) gives it its own.
run_old() { env LD_LIBRARY_PATH="$old:${LD_LIBRARY_PATH:-}" "$old/megamoe" "$@"; }
run_new() { "$B/megamoe" "$@"; }
export -f run_old run_new; export old B
deadline=${DEADLINE_S:-500}; start=$(date +%s); summary=()
pack() { tar -czf "$out/w4a8_v4.tgz" -C "$logs" . 2>/dev/null; }
step() {  # step NAME LIMIT command...
  local name=$1 limit=$2; shift 2; local t0 rc=0 l; t0=$(date +%s); l=$(( deadline - (t0 - start) ))
  if [ "$l" -lt 15 ]; then summary+=("$name|skipped (deadline)|-"); return 1; fi
  [ "$limit" -gt "$l" ] && limit=$l
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($rc)|$(( $(date +%s) - t0 ))s"); grep -E "FAILED|Failure|rror" "$logs/$name.log" | head -8; fi
  pack; return $rc
}
step test_gpu 150 bash -c 'pids=(); rc=0; for i in 0 1; do
    CUDA_VISIBLE_DEVICES=$i GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i "$0" >"$1.$i" 2>&1 & pids+=($!); done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done; cat "$1".*; exit $rc' "$T/megamoe_tests_gpu" "$logs/test_gpu_shard"
step small_m_sanitize 90 bash -c 'CUDA_VISIBLE_DEVICES=0 compute-sanitizer --tool synccheck --error-exitcode 1 "$0" \
    --gtest_filter=GroupedGemmW4a8.Gemm1SiluTopk:GroupedGemmW4a8.PlainRandomShapes & a=$!
  CUDA_VISIBLE_DEVICES=1 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$0" \
    --gtest_filter=GroupedGemmW4a8.Gemm1SiluTopk:GroupedGemmW4a8.BitExactRepresentableInputs & b=$!
  wait $a; ra=$?; wait $b; rb=$?; echo "synccheck rc=$ra memcheck rc=$rb"; exit $(( ra | rb ))' "$T/megamoe_tests_gpu"
step bench_gemm 100 bash -c '
  ( export CUDA_VISIBLE_DEVICES=0; w="--no-cublas --models dsv3 qwen3-30b --rows 8 32 128 1024"
    for fmt in nvfp4 mxfp4; do
      run_old bench gemm $w --format $fmt --json "$0/gemm_${fmt}_old.json" >"$0/gemm_${fmt}_old.txt"
      run_new bench gemm $w --format $fmt --json "$0/gemm_${fmt}_new.json" >"$0/gemm_${fmt}_new.txt"
      MEGAMOE_W4A8_SMALL_M=0 run_new bench gemm $w --format $fmt --json "$0/gemm_${fmt}_new2wg.json" >"$0/gemm_${fmt}_new2wg.txt"
    done ) &
  ( export CUDA_VISIBLE_DEVICES=1; w="--no-cublas --models dsv3 qwen3-30b --rows 8 128 1024 4096 --format fp8"
    run_old bench gemm $w --json "$0/gemm_fp8_old.json" >"$0/gemm_fp8_old.txt"
    run_new bench gemm $w --json "$0/gemm_fp8_new.json" >"$0/gemm_fp8_new.txt"
    run_old bench gemm $w --json "$0/gemm_fp8_old2.json" >"$0/gemm_fp8_old2.txt" ) &
  wait' "$logs"
step test_multigpu 130 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu" \
  --gtest_filter='EpMulti.*:MegaMulti.MatchesReferenceOnEveryRouting:MegaMulti.Nvfp4*:MegaMulti.Mxfp4*:MegaMulti.W4a8ChangingTokenCountsEveryCall:MegaMulti.StalledPeerTimesOutWithItsName'
for v in old new; do
  step "layer_fp8_$v" 60 bash -c "run_$v bench layer --backend staged,mega --ranks 2 --preset dsv3 --format fp8_block \
    --tokens 128,2048,8192 --iters 10 --json '$logs/layer_fp8_$v.json'"
done
step layer_nvfp4_new 60 bash -c "run_new bench layer --backend staged,mega --mega-path both --ranks 2 --preset dsv3 \
  --format nvfp4 --tokens 128,512,2048 --iters 5 --json '$logs/layer_nvfp4_new.json'"
step layer_nvfp4_old 50 bash -c "run_old bench layer --backend staged,mega --ranks 2 --preset dsv3 \
  --format nvfp4 --tokens 128,512 --iters 5 --json '$logs/layer_nvfp4_old.json'"
grep -h -E "^\[  (PASSED|FAILED)  \]|ERROR SUMMARY" "$logs"/test_*.log "$logs"/small_m_sanitize.log 2>/dev/null | sort | uniq -c
python3 - "$logs" <<'PY'
import json, sys, os
d = sys.argv[1]
def load(name):
    p = os.path.join(d, name)
    return {(c["model"], c["rows_per_expert"], c["gemm"]): c for c in json.load(open(p))} if os.path.exists(p) else {}
for fmt, names in (("nvfp4", ("old", "new", "new2wg")), ("mxfp4", ("old", "new", "new2wg")), ("fp8", ("old", "new", "old2"))):
    runs = [load("gemm_%s_%s.json" % (fmt, n)) for n in names]
    print("== bench gemm %s: us %s; new / old speed-up; new weight GB/s, TFLOP/s" % (fmt, " / ".join(names)))
    for key in sorted(runs[1], key=lambda k: (k[0], k[1], k[2])):
        try:
            us = [r[key]["us"] for r in runs]
            print("  %-10s %5d %s  %s   %.3f   %6.0f GB/s %6.0f TF" % (key[0], key[1], key[2],
                  " / ".join("%8.1f" % u for u in us), us[0] / us[1], runs[1][key]["weight_gbps"], runs[1][key]["tflops"]))
        except (KeyError, TypeError):
            pass
for name in ("layer_fp8_old", "layer_fp8_new", "layer_nvfp4_new", "layer_nvfp4_old"):
    p = os.path.join(d, name + ".json")
    if os.path.exists(p):
        j = json.load(open(p))
        print("== %s: " % name + " | ".join("%s %d: %.0f us (%.2fx)" % (c["backend"], c["tokens"], c["median_us"], c["ratio_to_floor"])
                                            for c in j["cases"]))
PY
printf '\n%-22s %-20s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-22s %-20s %s\n' "$a" "$b" "$c"; done
pack
