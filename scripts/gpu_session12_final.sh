#!/usr/bin/env bash
# One device call (2 x H200, <= 540 s; session 12's last): main with v11 on by default for GEMM 2 (prefer_fp8_v11) and
# the opt-in two-pass GEMM 1. Prebuilt: scripts/prebuild.sh main; carry .xfer/pre-main (as a tgz if the tree is big).
#   source scripts/use_prebuilt.sh main && OUT=$OUT bash scripts/gpu_session12_final.sh
# Steps: the whole one-GPU suite (sharded over both GPUs); bench layer dsv3 FP8 on 2 ranks at 128 / 2048 / 8192 tokens,
# staged + mega, in alternating processes: "old" (MEGAMOE_FP8_GEMM_V11=0), "new" (defaults), "new+2pass"
# (MEGAMOE_FP8_GEMM1_TWO_PASS=1), two rounds; the whole 2-rank suite. Last a table.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh main first}; T=$B/tests
budget_s=540; pack_name=session12_final.tgz
source scripts/device_steps.sh
step_sharded_gpu_suite test_gpu 200 "$T/megamoe_tests_gpu"
for round in 1 2; do
  for cfg in old new new2pass; do
    case $cfg in old) env_args=(MEGAMOE_FP8_GEMM_V11=0 MEGAMOE_FP8_GEMM1_TWO_PASS=0) ;;
                 new) env_args=(MEGAMOE_FP8_GEMM1_TWO_PASS=0) ;;
                 new2pass) env_args=(MEGAMOE_FP8_GEMM1_TWO_PASS=1) ;; esac
    step "layer_${cfg}_$round" 50 env "${env_args[@]}" "$B/megamoe" bench layer --backend staged,mega --ranks 2 \
      --preset dsv3 --format fp8_block --tokens 128,2048,8192 --iters 8 --json "$logs/layer_${cfg}_$round.json"
  done
done
step test_multigpu 240 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
print_test_counts
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
res = {}
for f in sorted(os.listdir(d)):
    if not (f.startswith("layer_") and f.endswith(".json")): continue
    cfg, rnd = f[6:-5].rsplit("_", 1)
    for r in json.load(open(os.path.join(d, f)))["cases"]:
        ph = r.get("phases_us") or {}
        tag = "%d" % r["median_us"] + (" (g1 %d g2 %d)" % (ph.get("gemm1", 0), ph.get("gemm2", 0)) if ph else "")
        res.setdefault((r.get("tokens"), r.get("backend"), cfg), []).append(tag)
print("layer dsv3 fp8, 2 ranks, rank-0 median us per round")
for k in sorted(res, key=lambda k: (k[0], k[1], k[2])): print("%6s %-8s %-9s %s" % (k[0], k[1], k[2], "  ".join(res[k])))
PY
print_summary
pack
