#!/usr/bin/env bash
# One device call (ONE H200, <= 300 s, prebuilt w4a8-g1-layer): W4A8 v10 GEMM 1 in the layers behind
# MEGAMOE_W4A8_G1_V10=1 (docs/grouped_gemm.md "W4A8 v10 GEMM 1", "In the layers"): staged packs W4A8 W13
# kGateUpInterleaved8 and runs the v10 GEMM-1 kernel at every rows hint; mega keeps its fused kGateUp W13 and gives its
# split path its own interleaved copy (docs/mega.md "One W13"). Everything is packed into ONE file,
# $OUT/w4a8_g1_layer.tgz, after every step. Budget-ordered:
# (1) tests (limit 150 s), with MEGAMOE_W4A8_G1_V10=1 in the environment (the new tests set the switch themselves;
#     the existing W4A8 staged / mega tests then make every layer with the interleaved W13) and
#     MEGAMOE_MEGA_LOG_MEMORY=1 (mega prints its W13 + split-copy bytes and packings): the new
#     EpSingle.StagedW4a8Gemm1V10MatchesReference and MegaSingle.W4a8Gemm1V10LayersMatchTheOldPacking/{nvfp4,mxfp4}
#     (switch on vs off, 0 differing elements), EpSingle.StagedMatchesReference* and MegaSingle.*/{nvfp4,mxfp4}.
# (2) bench layer, one rank, staged, nvfp4: dsv3-like (H 7168, I 2048, top-8, 64 experts: 16 / 128 / 512 rows per
#     expert) and qwen3-30b (128 experts: 8 / 64 / 256 rows) at 128, 1024, 4096 tokens, switch unset vs 1 in
#     alternating processes (the switch is read once per process), two rounds.
# (3) the table: us per forward (min over rounds of the rank-0 median), unset / 1 (> 1: the switch is faster).
#   source scripts/use_prebuilt.sh w4a8-g1-layer .xfer/w4a8-g1-layer && PREBUILT=$PREBUILT OUT=$OUT \
#     bash .xfer/w4a8-g1-layer/scripts/gpu_w4a8_g1_layer.sh
# NOTES: dsv3 with 64 experts instead of 256 (--experts 64): one rank holds what 4 of 8 EP ranks would, the host
# packing of 256 experts (two rounds, two settings) would eat the budget, and 128 tokens still lands <= 64 rows per
# expert (the old path's small-M kernel, which the switch replaces by the 128-row v10 tiles).
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh w4a8-g1-layer first}
budget_s=${BUDGET_S:-300}; pack_name=w4a8_g1_layer.tgz
source "$(dirname "$0")/device_steps.sh"
T="$B/tests/megamoe_tests_gpu"
step test_layers 150 env MEGAMOE_W4A8_G1_V10=1 MEGAMOE_MEGA_LOG_MEMORY=1 "$T" --gtest_filter="${TEST_FILTER:-EpSingle.StagedW4a8Gemm1V10MatchesReference:MegaSingle.W4a8Gemm1V10LayersMatchTheOldPacking/*:EpSingle.StagedMatchesReference*:MegaSingle.*/nvfp4:MegaSingle.*/mxfp4}"
print_test_counts
grep -hE "^\[  FAILED  \]" "$logs"/test_*.log | sort -u | head -20
grep -h "mega weights rank" "$logs/test_layers.log" | sed 's/^.*megamoe: //' | sort | uniq -c | head -8
bench_round() {
  local round=$1 model v
  for model in dsv3 qwen3-30b; do
    local extra=(); [ "$model" = dsv3 ] && extra=(--experts 64)
    for v in 0 1; do
      local env_args=(-u MEGAMOE_W4A8_G1_V10); [ "$v" = 1 ] && env_args=(MEGAMOE_W4A8_G1_V10=1)
      step "layer_${model}_${v}_$round" 45 env "${env_args[@]}" "$B/megamoe" bench layer --backend staged --ranks 1 \
        --preset "$model" "${extra[@]}" --format nvfp4 --tokens 128,1024,4096 --iters 10 \
        --json "$logs/layer_${model}_${v}_$round.json"
      grep -E "^\| staged " "$logs/layer_${model}_${v}_$round.log" | awk -v n="${model} v$v r$round" -F'|' '{print n, $2, $3, $5}'
    done
  done
}
bench_round 1
bench_round 2
pack
print_summary
echo; echo "bench layer staged nvfp4, one rank: setting0 = MEGAMOE_W4A8_G1_V10 unset (kGateUp, old GEMM-1 kernels),"
echo "setting1 = 1 (kGateUpInterleaved8, v10 GEMM 1); ratio = unset / 1 (> 1: the switch is faster)"
python3 "$(dirname "$0")/layer_ab_table.py" "$logs"
