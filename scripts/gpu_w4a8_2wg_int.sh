#!/usr/bin/env bash
# One device call (ONE H200, <= 240 s for the GEMM part + <= 240 s for the layers, prebuilt w4a8-2wg-int): the
# 2-warpgroup W4A8 kernel's kSwigluInterleavedFp8 mode (GEMM 1 on W13 packed kGateUpInterleaved8 at rows hints 1..32
# with the spread epilogue; docs/grouped_gemm.md "W4A8 2-warpgroup GEMM 1 on interleaved W13 (session 19)") and the
# fused mega kernel's W4A8 GEMM 1 on the same packing (docs/mega.md "One W13"). MEGAMOE_W4A8_G1_V10=1 makes `megamoe
# bench gemm` / the layers pack W13 kGateUpInterleaved8; unset = kGateUp (the old kernels: the 2-warpgroup spread
# kernel at <= 32 rows, small-M at 64). The switch is read once per process: alternating processes. Everything packed
# into $OUT/w4a8_2wg_int.tgz after every step. Budget-ordered:
# (1) tests (limit 100 s): GroupedGemmW4a8.W4a8TwoWarpgroupInterleaved* (new mode vs the kGateUp 2-warpgroup kernel,
#     byte for byte, 96 launch pairs; fp64 reference), GroupedGemmW4a8.W4a8V10Gemm1SmallMInterleaved* (the small-M
#     interleaved mode, whose epilogue and promotion are now the shared functions), and
#     MegaSingle.W4a8Gemm1V10LayersMatchTheOldPacking/* (fused, split, auto on the ONE interleaved W13 and fused on its
#     own kGateUp W13 vs staged on kGateUp, byte for byte) with MEGAMOE_MEGA_LOG_MEMORY=1 (the W13 bytes per layer).
# (2) bench gemm --gemms 1, nvfp4 and mxfp4, dsv3 ms4 qwen3-30b, 32 experts, exact 8 16 32 64 rows, switch unset / 1
#     in alternating processes, rounds 1 and 2. (3) compute-sanitizer memcheck of the new reference test (limit 45 s).
# (4) the GEMM table (bench_variant_table.py: v1 = interleaved vs v0 = kGateUp).
# (5) if the budget allows: bench layer --ranks 1 --preset dsv3 --experts 64 --format nvfp4 --tokens 128,1024, staged
#     then mega, switch unset / 1 alternating, two rounds; the layer table (layer_ab_table.py, ratio = unset / 1).
#   source scripts/use_prebuilt.sh w4a8-2wg-int .xfer/w4a8-2wg-int && PREBUILT=$PREBUILT OUT=$OUT \
#     bash .xfer/w4a8-2wg-int/scripts/gpu_w4a8_2wg_int.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh w4a8-2wg-int first}
budget_s=${GEMM_BUDGET_S:-240}; pack_name=w4a8_2wg_int.tgz
source "$(dirname "$0")/device_steps.sh"
T="$B/tests/megamoe_tests_gpu"
step test_g1 100 env MEGAMOE_MEGA_LOG_MEMORY=1 "$T" --gtest_filter="${TEST_FILTER:-GroupedGemmW4a8.W4a8TwoWarpgroupInterleaved*:GroupedGemmW4a8.W4a8V10Gemm1SmallMInterleaved*:MegaSingle.W4a8Gemm1V10LayersMatchTheOldPacking/*}"
grep -hE "^\[  FAILED  \]|launch pairs" "$logs/test_g1.log" | sort -u | head -20
grep -h "mega weights rank" "$logs/test_g1.log" | sed 's/^.*megamoe: //' | sort | uniq -c | head -8
bench_round() {
  local round=$1 format v
  for format in ${FORMATS:-nvfp4 mxfp4}; do
    for v in 0 1; do
      local env_args=(-u MEGAMOE_W4A8_G1_V10); [ "$v" = 1 ] && env_args=(MEGAMOE_W4A8_G1_V10=1)
      step "bench_${format}_v${v}_none_$round" 40 env "${env_args[@]}" \
        "$B/megamoe" bench gemm --gemms 1 --format "$format" --models dsv3 ms4 qwen3-30b --rows 8 16 32 64 \
        --rows-spread none --no-cublas --repeats 10 --json "$logs/bench_${format}_v${v}_none_$round.json"
    done
  done
}
bench_round 1
bench_round 2
step memcheck_g1 45 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$T" \
  --gtest_filter="${MEMCHECK_FILTER:-GroupedGemmW4a8.W4a8TwoWarpgroupInterleavedGemm1AgainstReference}"
tail -3 "$logs/memcheck_g1.log"
print_test_counts
echo; echo "bench gemm --gemms 1: v0 = MEGAMOE_W4A8_G1_V10 unset (kGateUp), v1 = 1 (kGateUpInterleaved8: the new"
echo "2-warpgroup mode at 8-32 rows, small-M interleaved at 64)"
python3 "$(dirname "$0")/bench_variant_table.py" "$logs" w4a8-2wg-int gemm1 kgateup
# (5) the layers, with what is left of GEMM_BUDGET_S + LAYER_BUDGET_S.
budget_s=$(( budget_s + ${LAYER_BUDGET_S:-240} ))
layer_round() {
  local round=$1 backend v
  for backend in staged mega; do
    for v in 0 1; do
      local env_args=(-u MEGAMOE_W4A8_G1_V10); [ "$v" = 1 ] && env_args=(MEGAMOE_W4A8_G1_V10=1)
      step "layer_${backend}_${v}_$round" 45 env "${env_args[@]}" MEGAMOE_MEGA_LOG_MEMORY=1 "$B/megamoe" bench layer \
        --backend "$backend" --ranks 1 --preset dsv3 --experts 64 --format nvfp4 --tokens 128,1024 --iters 10 \
        --json "$logs/layer_${backend}_${v}_$round.json"
      grep -E "^\| $backend " "$logs/layer_${backend}_${v}_$round.log" | awk -v n="${backend} v$v r$round" -F'|' '{print n, $2, $3, $5}'
    done
  done
}
layer_round 1
layer_round 2
grep -h "mega weights rank" "$logs"/layer_mega_*.log 2>/dev/null | sed 's/^.*megamoe: //' | sort | uniq -c | head -4
pack
print_summary
echo; echo "bench layer nvfp4 dsv3 (64 experts), one rank: setting0 = MEGAMOE_W4A8_G1_V10 unset, setting1 = 1;"
echo "ratio = unset / 1 (> 1: the interleaved W13 is faster)"
python3 "$(dirname "$0")/layer_ab_table.py" "$logs"
