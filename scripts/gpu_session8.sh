#!/usr/bin/env bash
# One device call (2 x H200, prebuilt main: scripts/prebuild.sh main, carry .xfer/pre-main) after the
# session-8 merges (gemm-v9 default for K <= 4096, mega W4A8, rendezvous generations, rows hint default):
#   smoke (mega nvfp4), the one-GPU suite on GPU 0 beside the slow full-buffer GEMM tests on GPU 1, the
#   2-rank suite, then bench layer (dsv3 fp8 staged + mega; nvfp4 staged + mega; qwen3 staged v9 on/off).
#   OUT=$OUT bash scripts/gpu_session8.sh        (logs + JSON in one tgz after every step; table last)
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
source scripts/use_prebuilt.sh main >/dev/null || exit 1
B=$PREBUILT; T=$B/tests
summary=()
pack() { tar -czf "$out/session8.tgz" -C "$logs" . 2>/dev/null; }
step() {  # step NAME TIMEOUT command...
  local name=$1 limit=$2; shift 2; local t0=$(date +%s) rc=0
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($rc)|$(( $(date +%s) - t0 ))s"); grep -E "FAILED|Failure|error" "$logs/$name.log" | head -12; fi
  pack; return $rc
}
step smoke 40 "$T/megamoe_tests_gpu" --gtest_filter='MegaSingle.MatchesReferenceAndStagedReplaysAndRepeats/nvfp4' || true
( CUDA_VISIBLE_DEVICES=1 timeout 230 "$T/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.*FullBuffer*' \
    >"$logs/fullbuffer.log" 2>&1; echo "fullbuffer rc=$?" >>"$logs/fullbuffer.log" ) &
step test_gpu 230 env CUDA_VISIBLE_DEVICES=0 "$T/megamoe_tests_gpu" --gtest_filter='-*FullBuffer*'
wait; summary+=("fullbuffer|$(tail -1 "$logs/fullbuffer.log")|-"); pack
step test_multigpu 170 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
step layer_fp8 100 "$B/megamoe" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format fp8_block \
  --tokens 128,2048,8192 --iters 10 --json "$logs/layer_fp8.json"
step layer_nvfp4 80 "$B/megamoe" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format nvfp4 \
  --tokens 128,8192 --iters 5 --json "$logs/layer_nvfp4.json"
for v9 in 0 1; do
  step "layer_qwen3_v9_$v9" 50 env MEGAMOE_FP8_GEMM1_V9=$v9 "$B/megamoe" bench layer --backend staged --ranks 2 \
    --preset qwen3-30b --format fp8_block --tokens 2048,8192 --iters 10 --json "$logs/layer_qwen3_v9_$v9.json"
done
grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$logs"/test_*.log "$logs"/fullbuffer.log "$logs"/smoke.log 2>/dev/null | sort | uniq -c | head -30
for f in layer_fp8 layer_nvfp4 layer_qwen3_v9_0 layer_qwen3_v9_1; do
  [ -f "$logs/$f.log" ] && { echo "== $f"; grep -E "^\| (staged|mega) " "$logs/$f.log" | cut -c1-100,150-250; }
done
printf '\n%-20s %-22s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-20s %-22s %s\n' "$a" "$b" "$c"; done
pack
