#!/usr/bin/env bash
# One device call (ONE H200, <= 450 s; session 13, when the 2-GPU kind is not lent): the whole one-GPU suite, then bench
# layer FP8 on one rank (staged + mega) for dsv3 at 128 / 1024 / 2048 / 8192 tokens and ms4 / qwen3-30b at 128 / 2048.
#   source scripts/use_prebuilt.sh main && OUT=$OUT bash scripts/gpu_session13_one.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh main first}; T=$B/tests
budget_s=${BUDGET_S:-450}; pack_name=session13_one.tgz
source scripts/device_steps.sh
step test_gpu 330 "$T/megamoe_tests_gpu"
step layer_dsv3_1 45 "$B/megamoe" bench layer --backend staged,mega --ranks 1 --preset dsv3 --format fp8_block \
  --tokens 128,1024,2048,8192 --iters 8 --json "$logs/layer_dsv3_1.json"
for model in ms4 qwen3-30b; do
  step "layer_${model}_1" 25 "$B/megamoe" bench layer --backend staged,mega --ranks 1 --preset "$model" --format fp8_block \
    --tokens 128,2048 --iters 8 --json "$logs/layer_${model}_1.json"
done
print_test_counts
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
print("layer fp8, 1 rank, rank-0 median us (GEMM 1 / GEMM 2 phase)")
for f in sorted(os.listdir(d)):
    if not (f.startswith("layer_") and f.endswith(".json")): continue
    for r in json.load(open(os.path.join(d, f)))["cases"]:
        ph = r.get("phases_us") or {}
        print("%-10s %6s %-18s %d (g1 %d g2 %d)" % (f[6:-7], r["tokens"], r["backend"], r["median_us"], ph.get("gemm1", 0), ph.get("gemm2", 0)))
PY
print_summary
pack
