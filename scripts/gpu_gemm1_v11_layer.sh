#!/usr/bin/env bash
# One device call (2 x H200, <= 420 s; session 13): where v11 GEMM 1 (sm90_fp8_wide_gemm1.cuh, on the v9
# gate/up-interleaved weights) pays in the layer, before it becomes a default. Prebuilt v11-gemm1:
#   source scripts/use_prebuilt.sh v11-gemm1 .xfer/v11-gemm1 && OUT=$OUT bash scripts/gpu_gemm1_v11_layer.sh
# Steps: (1) bench gemm GEMM 1 at 8-128 rows per expert, split-N (main column) vs v9 vs v11 per point;
# (2) bench layer staged on 2 ranks, alternating processes, two rounds: dsv3 at 128-8192 tokens with the
# split-N GEMM 1 (default for hidden 7168), v9 (MEGAMOE_FP8_GEMM1_V9=1) and v11 (+ MEGAMOE_FP8_GEMM1_V11=1);
# ms4 and qwen3-30b (v9 packing by default) with v11 off / on. Last a table.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh v11-gemm1 .xfer/v11-gemm1 first}
budget_s=420; pack_name=gemm1_v11_layer.tgz
source scripts/device_steps.sh
step bench_gemm_small 60 "$B/megamoe" bench gemm --format fp8 --models dsv3 ms4 qwen3-30b --rows 8 32 64 128 \
  --experts 128 --gemm1-v9 both --gemm1-v11 both --no-cublas --repeats 20 --json "$logs/bench_gemm_small.json"
for round in 1 2; do
  for cfg in splitn v9 v11; do
    case $cfg in splitn) env_args=(MEGAMOE_FP8_GEMM1_V9=0 MEGAMOE_FP8_GEMM1_V11=0) ;;
                 v9) env_args=(MEGAMOE_FP8_GEMM1_V9=1 MEGAMOE_FP8_GEMM1_V11=0) ;;
                 v11) env_args=(MEGAMOE_FP8_GEMM1_V9=1 MEGAMOE_FP8_GEMM1_V11=1) ;; esac
    step "layer_dsv3_${cfg}_$round" 60 env "${env_args[@]}" "$B/megamoe" bench layer --backend staged --ranks 2 \
      --preset dsv3 --format fp8_block --tokens 128,512,1024,2048,8192 --iters 8 --json "$logs/layer_dsv3_${cfg}_$round.json"
  done
done
for model in ms4 qwen3-30b; do
  for cfg in v9 v11; do
    case $cfg in v9) env_args=(MEGAMOE_FP8_GEMM1_V11=0) ;; v11) env_args=(MEGAMOE_FP8_GEMM1_V11=1) ;; esac
    step "layer_${model}_${cfg}_1" 45 env "${env_args[@]}" "$B/megamoe" bench layer --backend staged --ranks 2 \
      --preset "$model" --format fp8_block --tokens 128,2048,8192 --iters 8 --json "$logs/layer_${model}_${cfg}_1.json"
  done
done
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
try:
    print("bench gemm GEMM 1 (128 experts), us: split-N / v9 / v11")
    for r in json.load(open(os.path.join(d, "bench_gemm_small.json"))):
        if r.get("gemm") != "gemm1": continue
        print("%-10s %4d | %8.1f %8s %8s" % (r["model"], r["rows_per_expert"], r["us"],
              "%.1f" % r["v9_us"] if "v9_us" in r else "-", "%.1f" % r["v11_us"] if "v11_us" in r else "-"))
except Exception as e:
    print("bench gemm table failed:", e)
res = {}
for f in sorted(os.listdir(d)):
    if not (f.startswith("layer_") and f.endswith(".json")): continue
    model, cfg, rnd = f[6:-5].rsplit("_", 2)
    for r in json.load(open(os.path.join(d, f)))["cases"]:
        ph = r.get("phases_us") or {}
        res.setdefault((model, r.get("tokens"), cfg), []).append("%d (g1 %d)" % (r["median_us"], ph.get("gemm1", 0)))
print("layer staged fp8, 2 ranks, rank-0 median us per round (GEMM-1 phase)")
for k in sorted(res): print("%-10s %6s %-7s %s" % (k[0], k[1], k[2], "  ".join(res[k])))
PY
print_summary
pack
