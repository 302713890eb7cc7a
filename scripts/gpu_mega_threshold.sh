#!/usr/bin/env bash
# One device call (2 x H200, <= 150 s): mega fused vs split (--mega-path both) vs staged on 2 ranks at 128-1024 tokens
# (means of 8-64 rows per local expert), dsv3 / ms4 / qwen3-30b FP8: where kMegaFusedMaxRowsPerExpert should sit now
# that staged and the split path run v11 GEMM 1 (and its small tile) while the fused kernel keeps the split-N GEMM 1.
#   source scripts/use_prebuilt.sh main && OUT=$OUT bash scripts/gpu_mega_threshold.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh main first}
budget_s=${BUDGET_S:-150}; pack_name=mega_threshold.tgz
source scripts/device_steps.sh
for round in 1 2; do
  for model in dsv3 ms4 qwen3-30b; do
    step "layer_${model}_$round" 40 "$B/megamoe" bench layer --backend staged,mega --mega-path both --ranks 2 \
      --preset "$model" --format fp8_block --tokens 128,256,512,1024 --iters 8 --json "$logs/layer_${model}_$round.json"
  done
done
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
res = {}
for f in sorted(os.listdir(d)):
    if not (f.startswith("layer_") and f.endswith(".json")): continue
    model = f[6:-5].rsplit("_", 1)[0]
    for r in json.load(open(os.path.join(d, f)))["cases"]:
        res.setdefault((model, r["tokens"], r["backend"]), []).append("%d" % r["median_us"])
print("2 ranks, rank-0 median us per round")
for k in sorted(res): print("%-10s %5d %-22s %s" % (k[0], k[1], k[2], " ".join(res[k])))
PY
print_summary
pack
