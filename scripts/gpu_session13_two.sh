#!/usr/bin/env bash
# One device call (2 x H200, <= 420 s; session 13, after gpu_session13_one.sh ran the one-GPU suite): the whole 2-rank
# suite, then bench layer FP8 on 2 ranks (staged + mega): dsv3 at 128 / 512 / 1024 / 2048 / 8192 tokens, ms4 and
# qwen3-30b at 128 / 2048 / 8192.
#   source scripts/use_prebuilt.sh main && OUT=$OUT bash scripts/gpu_session13_two.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh main first}; T=$B/tests
budget_s=${BUDGET_S:-420}; pack_name=session13_two.tgz
source scripts/device_steps.sh
step test_multigpu 260 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
step layer_dsv3_1 60 "$B/megamoe" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format fp8_block \
  --tokens 128,512,1024,2048,8192 --iters 8 --json "$logs/layer_dsv3_1.json"
for model in ms4 qwen3-30b; do
  step "layer_${model}_1" 40 "$B/megamoe" bench layer --backend staged,mega --ranks 2 --preset "$model" --format fp8_block \
    --tokens 128,2048,8192 --iters 8 --json "$logs/layer_${model}_1.json"
done
print_test_counts
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
print("layer fp8, 2 ranks, rank-0 median us (dispatch / GEMM 1 / GEMM 2 / combine)")
for f in sorted(os.listdir(d)):
    if not (f.startswith("layer_") and f.endswith(".json")): continue
    for r in json.load(open(os.path.join(d, f)))["cases"]:
        ph = r.get("phases_us") or {}
        print("%-10s %6s %-18s %d (%d / %d / %d / %d)" % (f[6:-7], r["tokens"], r["backend"], r["median_us"],
              ph.get("dispatch", 0), ph.get("gemm1", 0), ph.get("gemm2", 0), ph.get("combine", 0)))
PY
print_summary
pack
