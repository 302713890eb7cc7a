#!/usr/bin/env bash
# One device call (2 x H200, <= BUDGET_S s, default 560): main's whole suites and the FP8 layer (session 13 call 3 ran it
# as gpu_session13_main.sh; session 14 call C with BUDGET_S=480 SHARD_LIMIT=180 PACK_NAME=session14_main.tgz).
# Prebuilt: scripts/prebuild.sh main; carry .xfer/pre-main (as a tgz: the tree is big).
#   source scripts/use_prebuilt.sh main && OUT=$OUT bash scripts/gpu_main_suites.sh
# Steps: the whole one-GPU suite (sharded over both GPUs); bench layer FP8 on 2 ranks, staged + mega: dsv3 at 128 / 2048
# / 8192 tokens (two rounds), bench ep 4096 / 8192, ms4 and qwen3-30b (one round); the whole 2-rank suite
# (MULTI_LIMIT s, default 270: it took 239 s in session 16 call 1); then, as the budget allows, dsv3 nvfp4 on 2 ranks
# at 128 / 8192 tokens. Last a table.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh main first}; T=$B/tests
budget_s=${BUDGET_S:-560}; pack_name=${PACK_NAME:-main_suites.tgz}
source scripts/device_steps.sh
step_sharded_gpu_suite test_gpu "${SHARD_LIMIT:-220}" "$T/megamoe_tests_gpu"
clock_sampler_start  # GPU 0's clock / power per bench step (print_clock_table below)
for round in 1 2; do
  clock_mark "layer_dsv3_$round" start
  step "layer_dsv3_$round" 60 "$B/megamoe" bench layer --backend staged,mega --ranks 2 \
    --preset dsv3 --format fp8_block --tokens 128,2048,8192 --iters 8 --json "$logs/layer_dsv3_$round.json"
  clock_mark "layer_dsv3_$round" end
done
for tokens in 4096 8192; do  # the EP dispatch / combine at the defaults
  step "ep_${tokens}" 20 "$B/megamoe" bench ep --ranks 2 --tokens "$tokens" --hidden 7168 --top-k 8 --experts 256 --iters 20
done
for model in ms4 qwen3-30b; do
  step "layer_${model}_1" 45 "$B/megamoe" bench layer --backend staged,mega --ranks 2 \
    --preset "$model" --format fp8_block --tokens 128,2048,8192 --iters 8 --json "$logs/layer_${model}_1.json"
done
clock_sampler_stop
step test_multigpu "${MULTI_LIMIT:-270}" env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
# What the budget leaves: issue 5's W4A8 rows (dsv3 nvfp4, W13 interleaved by default since session 19).
step layer_dsv3nvfp4_1 60 "$B/megamoe" bench layer --backend staged,mega --ranks 2 \
  --preset dsv3 --format nvfp4 --tokens 128,8192 --iters 5 --json "$logs/layer_dsv3nvfp4_1.json"
print_test_counts
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
res = {}
for f in sorted(os.listdir(d)):
    if not (f.startswith("layer_") and f.endswith(".json")): continue
    model, rnd = f[6:-5].rsplit("_", 1)
    for r in json.load(open(os.path.join(d, f)))["cases"]:
        ph = r.get("phases_us") or {}
        tag = "%d" % r["median_us"] + (" (g1 %d g2 %d)" % (ph.get("gemm1", 0), ph.get("gemm2", 0)) if ph else "")
        res.setdefault((model, r.get("tokens"), r.get("backend")), []).append(tag)
print("layer (fp8 unless the case name says nvfp4), 2 ranks, rank-0 median us per round")
for k in sorted(res): print("%-10s %6s %-18s %s" % (k[0], k[1], k[2], "  ".join(res[k])))
PY
print_clock_table
print_summary
print_ep_table
pack
