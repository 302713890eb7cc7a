#!/usr/bin/env bash
# One device call (2 x H200, <= 300 s): dispatch with local rows grouped by the send kernel (branch dispatch-local,
# docs/ep.md "Protocol" steps 2-3) against main, side by side. Carry .xfer/pre-main + .xfer/pre-dispatch-local +
# .xfer/dispatch-local (one tgz). (1) branch: EpSingle.* + StagedPhaseTiming.* + MegaSingle-free EP users on one GPU,
# EpMulti.* + MegaMulti.*Matches* at 2 ranks (bit-exact dispatch/combine, staged vs reference, graph replay,
# capacity overflow, stalled peer). (2) bench ep 4096 / 8192 tokens x 7168, top-8 of 256, main / branch alternating,
# two rounds. (3) staged dsv3 fp8 layer on 2 ranks at 2048 / 8192 tokens, main / branch alternating. Table last.
#   tar xzf dl.tgz && source scripts/use_prebuilt.sh dispatch-local .xfer/dispatch-local && \
#     OUT=$OUT bash .xfer/dispatch-local/scripts/gpu_dispatch_local.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
budget_s=${BUDGET_S:-290}; pack_name=dispatch_local.tgz
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/device_steps.sh"
# use NAME [TREE]: the prebuilt's binaries in place + its environment, in THIS shell (P = its build directory)
use() { source scripts/use_prebuilt.sh "$1" "${2:-.}" >/dev/null && P=$PREBUILT; }
use dispatch-local .xfer/dispatch-local; B=$P
step test_gpu_ep 60 "$B/tests/megamoe_tests_gpu" --gtest_filter='EpSingle.*:StagedPhaseTiming.*:MoeWorkspace*'
step test_multi_ep 150 env MEGAMOE_TEST_RANKS=2 "$B/tests/megamoe_tests_multigpu" \
  --gtest_filter='EpMulti.*:MegaMulti.*Matches*:MoeWorkspaceMulti.*'
print_test_counts
for round in 1 2; do
  for v in main dispatch-local; do
    if [ "$v" = main ]; then use main; else use dispatch-local .xfer/dispatch-local; fi
    for tokens in 4096 8192; do
      step "ep_${v}_${tokens}_$round" 20 "$P/megamoe" bench ep --ranks 2 --tokens "$tokens" --hidden 7168 --top-k 8 \
        --experts 256 --iters 20
    done
  done
done
for round in 1 2; do
  for v in main dispatch-local; do
    if [ "$v" = main ]; then use main; else use dispatch-local .xfer/dispatch-local; fi
    step "layer_${v}_$round" 45 "$P/megamoe" bench layer --backend staged --ranks 2 --preset dsv3 --format fp8_block \
      --tokens 2048,8192 --iters 6 --json "$logs/layer_${v}_$round.json"
  done
done
cp "$logs"/test_*.log "$out/" 2>/dev/null
print_summary
print_ep_table
python3 "$here/scripts/layer_phases_table.py" "$logs"
