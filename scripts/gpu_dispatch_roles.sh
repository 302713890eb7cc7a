#!/usr/bin/env bash
# One device call (2 x H200, <= 560 s): the fused dispatch with warp roles (branch dispatch-roles, docs/ep.md
# "Overlap", "Fused dispatch with warp roles") against the two-kernel dispatch, from ONE prebuilt binary set.
#   here:   CCACHE_BASEDIR=/work scripts/prebuild.sh dispatch-roles /work/main   (binaries in .xfer/pre-dispatch-roles)
#           and a copy of the branch at /work/main/.xfer/dispatch-roles; carry both
#   device: source scripts/use_prebuilt.sh dispatch-roles .xfer/dispatch-roles && \
#           OUT=$OUT bash .xfer/dispatch-roles/scripts/gpu_dispatch_roles.sh
# Every case runs with MEGAMOE_EP_OVERLAP=1 (fused combine); the dispatch path is picked with
# MEGAMOE_EP_OVERLAP_DISPATCH=0 (layout + send + receive kernels, "d0") or 1 (layout + the fused kernel, "d1"),
# so the dispatch columns compare the two dispatch paths side by side (MEGAMOE_EP_OVERLAP=0 is timed once as well).
# (1) tests with the fused dispatch: EpSingle.* + StagedPhaseTiming.* on one GPU, EpMulti.* at 2 ranks (bit-exact
#     dispatch/combine, overlap 0 vs 1 bit for bit incl. dispatch piece 1, staged vs reference + graph replay,
#     capacity, stalled peer); (2) bench ep 4096 / 8192 x 7168, top-8 of 256: d0 / d1 alternating, two rounds,
#     then the piece sweep (MEGAMOE_EP_DISPATCH_PIECE = 4 / 16 / 56) and the role split (MEGAMOE_EP_DISPATCH_SEND_WARPS
#     = 12 / 16 / 20 of 32); (3) staged dsv3 fp8_block layer, 2 ranks,
#     2048 / 8192 tokens, d0 / d1. Table last.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh dispatch-roles .xfer/dispatch-roles first}
budget_s=${BUDGET_S:-560}; pack_name=dispatch_roles.tgz
here=$(cd "$(dirname "$0")/.." && pwd)
source "$here/scripts/device_steps.sh"
echo "binaries: $B ($(sed -n 's/^commit=//p' "$B/PATHS" 2>/dev/null))"
export MEGAMOE_EP_OVERLAP=1

MEGAMOE_EP_OVERLAP_DISPATCH=1 step test_gpu_ep 60 "$B/tests/megamoe_tests_gpu" \
  --gtest_filter='EpSingle.*:StagedPhaseTiming.*-*Overlap'
MEGAMOE_EP_OVERLAP_DISPATCH=1 step test_multi_ep 150 env MEGAMOE_TEST_RANKS=2 MEGAMOE_TEST_LAUNCH_TIMEOUT_S=80 \
  "$B/tests/megamoe_tests_multigpu" --gtest_filter='EpMulti.*-*Overlap'
print_test_counts

bench_ep() {  # NAME TOKENS [ENV...]
  local name=$1 tokens=$2; shift 2
  step "ep_${tokens}_$name" 20 env "$@" "$B/megamoe" bench ep --ranks 2 --tokens "$tokens" --hidden 7168 --top-k 8 \
    --experts 256 --iters 20
}
for round in 1 2; do
  for tokens in 4096 8192; do
    bench_ep "d0_r$round" "$tokens" MEGAMOE_EP_OVERLAP_DISPATCH=0
    bench_ep "d1_r$round" "$tokens" MEGAMOE_EP_OVERLAP_DISPATCH=1
  done
done
for tokens in 4096 8192; do
  bench_ep "o0" "$tokens" MEGAMOE_EP_OVERLAP=0
  for piece in 4 56; do  # 16 (the default) is d1 above; 56 = one publication per 7168-wide row
    bench_ep "d1_piece$piece" "$tokens" MEGAMOE_EP_OVERLAP_DISPATCH=1 MEGAMOE_EP_DISPATCH_PIECE=$piece
  done
  for warps in 12 20; do  # sender warps per block of 32 (16, the default, is d1 above)
    bench_ep "d1_send$warps" "$tokens" MEGAMOE_EP_OVERLAP_DISPATCH=1 MEGAMOE_EP_DISPATCH_SEND_WARPS=$warps
  done
done
for d in 0 1; do
  MEGAMOE_EP_OVERLAP_DISPATCH=$d step "layer_d$d" 60 "$B/megamoe" bench layer --backend staged --ranks 2 \
    --preset dsv3 --format fp8_block --tokens 2048,8192 --iters 6 --json "$logs/layer_d$d.json"
done

cp "$logs"/test_*.log "$out/" 2>/dev/null
print_summary
echo; echo "bench ep (rank 0): case | dispatch us GB/s | combine us GB/s | kernels: layout / send (d1: fused) / receive / combine send / reduce us"
for f in "$logs"/ep_*.log; do
  n=$(basename "$f" .log)
  d=$(grep -m1 '^| dispatch+combine' "$f" | awk -F'|' '{printf "%s %s | %s %s", $8, $9, $10, $11}')
  kt=$(grep -m1 '^| kernels us' "$f" | awk -F'|' '{printf "%s /%s /%s /%s /%s", $3, $4, $5, $6, $7}')
  echo "$n | $d | $kt"
done
python3 - "$logs" <<'PY'
import glob, json, os, sys
print("\nstaged dsv3 fp8_block, 2 ranks, rank-0 median: layer us | phases us (disp / g1 / g2 / comb)")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "layer_*.json"))):
    try:
        cases = json.load(open(f))["cases"]
    except Exception as e:
        print(os.path.basename(f), "unreadable", e); continue
    for c in cases:
        ph = " ".join("%s %.0f" % (k, v) for k, v in c.get("phases_us", {}).items())
        print("%-10s tokens %5d  %8.1f us  %s" % (os.path.basename(f)[:-5], c["tokens"], c["median_us"], ph))
PY
pack
