#!/usr/bin/env bash
# One device call (one H200, <= 330 s; session 12) for the integration of branches fp8-v11 (merged in main 31fd852) and
# gemm1-two-pass: prebuilt s12-int (scripts/prebuild.sh s12-int in its worktree; tree copy .xfer/s12-int).
#   source scripts/use_prebuilt.sh s12-int .xfer/s12-int && OUT=$OUT bash .xfer/s12-int/scripts/gpu_session12_int.sh
# Steps: (1) the two-pass tests + bench with v11 as the plain GEMM (MEGAMOE_FP8_GEMM_V11=1; v11 is bit-identical to the
# v8-v10 plain kernel, so every bit-exact check still holds); (2) v11 vs the old GEMM 2 at 8-128 rows per expert (where
# the old heuristic runs 64 x 256 / 128 x 128 tiles); (3) staged dsv3 FP8 layer on one rank (all 256 experts local, the
# 2-rank GEMM rows) at 2048 / 8192 tokens: baseline, v11, v11 + two-pass, alternating, two rounds. Last a table.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh s12-int first}; T=$B/tests
budget_s=320; pack_name=session12_int.tgz
source scripts/device_steps.sh
here=$(cd "$(dirname "$0")/.." && pwd)
MEGAMOE_FP8_GEMM_V11=1 PREBUILT=$B OUT=$logs/two_pass timeout 150 bash "$here/scripts/gpu_gemm1_two_pass.sh" \
  >"$logs/two_pass.log" 2>&1
echo "two-pass script rc=$?"; tail -22 "$logs/two_pass.log"
step bench_small 40 "$B/megamoe" bench gemm --format fp8 --models dsv3 qwen3-30b --rows 8 32 64 128 --experts 32 \
  --fp8-v11 both --no-cublas --json "$logs/bench_small.json"
for round in 1 2; do
  for cfg in base v11 v11tp; do
    case $cfg in base) env_args=(MEGAMOE_FP8_GEMM_V11=0 MEGAMOE_FP8_GEMM1_TWO_PASS=0) ;;
                 v11) env_args=(MEGAMOE_FP8_GEMM_V11=1 MEGAMOE_FP8_GEMM1_TWO_PASS=0) ;;
                 v11tp) env_args=(MEGAMOE_FP8_GEMM_V11=1 MEGAMOE_FP8_GEMM1_TWO_PASS=1) ;; esac
    step "layer_${cfg}_$round" 45 env "${env_args[@]}" "$B/megamoe" bench layer --backend staged --ranks 1 --preset dsv3 \
      --format fp8_block --tokens 2048,8192 --iters 5 --json "$logs/layer_${cfg}_$round.json"
  done
done
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
p = os.path.join(d, "bench_small.json")
if os.path.exists(p):
    print("%-10s %5s %5s | %9s %9s %6s" % ("model", "rows", "gemm", "old_us", "v11_us", "x"))
    for r in json.load(open(p)):
        if r["gemm"] == "gemm2" and "v11_us" in r:
            print("%-10s %5d %5s | %9.1f %9.1f %6.3f" % (r["model"], r["rows_per_expert"], r["gemm"], r["us"], r["v11_us"], r["us"] / r["v11_us"]))
print("\nlayer staged dsv3 fp8, 1 rank: median us (gemm1 / gemm2) per round")
res = {}
for f in sorted(os.listdir(d)):
    if not (f.startswith("layer_") and f.endswith(".json")): continue
    cfg, rnd = f[6:-5].rsplit("_", 1)
    for r in json.load(open(os.path.join(d, f)))["cases"]:
        ph = r.get("phases_us") or {}
        res.setdefault((r.get("tokens"), cfg), []).append("%d (%d / %d)" % (r["median_us"], ph.get("gemm1", 0), ph.get("gemm2", 0)))
for k in sorted(res): print("%6s %-6s %s" % (k[0], k[1], "  ".join(res[k])))
PY
print_summary
pack
