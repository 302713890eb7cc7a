#!/usr/bin/env bash
# One device call (2 x H200, <= 300 s): BF16 clusters as the default where the hidden size is >= 4096 (session 16;
# docs/grouped_gemm.md "BF16 clusters"). Prebuilt: scripts/prebuild.sh NAME; carry .xfer/pre-NAME as a tgz.
#   source scripts/use_prebuilt.sh NAME && OUT=$OUT bash scripts/gpu_bf16_default.sh
# (1) every BF16 test at the defaults: GroupedGemmBf16.* and the bf16 backend / model cases on one GPU (sharded over
# both), MegaMulti.Bf16* on 2 ranks; (2) bench layer bf16, 2 ranks, staged + mega, dsv3 / ms4 / qwen3-30b at
# 2048 / 8192 tokens, MEGAMOE_BF16_CLUSTER=0 beside the default. Table last.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; T=$B/tests
budget_s=${BUDGET_S:-300}; pack_name=bf16_default.tgz
source scripts/device_steps.sh
export GTEST_FILTER='*Bf16*:*bf16*'
step_sharded_gpu_suite test_gpu 100 "$T/megamoe_tests_gpu"
unset GTEST_FILTER
step test_multigpu 90 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu" --gtest_filter='MegaMulti.Bf16*'
print_test_counts
for model in dsv3 ms4 qwen3-30b; do
  for c in 0 default; do
    e=(); [ "$c" = 0 ] && e=(MEGAMOE_BF16_CLUSTER=0)
    step "layer_${model}_c$c" 40 env "${e[@]}" "$B/megamoe" bench layer --backend staged,mega --ranks 2 --preset "$model" \
      --format bf16 --tokens 2048,8192 --iters 6 --json "$logs/layer_${model}_c$c.json"
  done
done
print_summary
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
res = {}
for f in sorted(os.listdir(d)):
    if not (f.startswith("layer_") and f.endswith(".json")): continue
    model, c = f[6:-5].rsplit("_", 1)
    for r in json.load(open(os.path.join(d, f)))["cases"]:
        ph = r.get("phases_us") or {}
        res.setdefault((model, r.get("tokens"), r.get("backend")), {})[c] = (r["median_us"], ph.get("gemm1", 0), ph.get("gemm2", 0))
print("layer bf16, 2 ranks, rank-0 median us (g1 / g2): cluster 0 | default | ratio")
for k in sorted(res):
    a, b = res[k].get("c0"), res[k].get("cdefault")
    fmt = lambda v: "%7.0f (%5.0f / %5.0f)" % v if v else "%21s" % "-"
    print("%-10s %6s %-18s %s | %s | %s" % (k[0], k[1], k[2], fmt(a), fmt(b), "%.3f" % (a[0] / b[0]) if a and b else "-"))
PY
pack
