#!/usr/bin/env bash
# One device call (one H200, <= 120 s, prebuilt v11-gemm1-small): v11 GEMM 1 small (docs/grouped_gemm.md "v11 GEMM 1
# small", sm90_fp8_wide_gemm1.cuh: the 64 x 256 tile on kGateUpInterleaved8 weights whose two math warpgroups split N).
# (1) the GEMM-1 gtests: every run_gemm1 case runs v11 and v11 small with the TMA-scale switch off and on and
# requires v9's codes and scales bit for bit (v9 == split-N, judged against the fp64 / device references);
# Gemm1V11SmallTile (experts of 0 / 1 / 63 / 64 / 65 / 129 rows, K 384 / 2048 / 7168, both activations, top-k on /
# off); the no-GPU rejection test (v11_small = 2). (2) bench gemm, 128 experts, exactly 8 / 16 / 32 / 48 / 64 rows
# per expert, dsv3 / ms4 / qwen3-30b: split-N (main column, --gemm1-v9 off: 64-row tiles up to 56 rows, 128 at 64)
# vs v11 (128 x 256) vs v11 small, per point in one process, two rounds. (3) if budget is left, the staged dsv3
# layer on one rank at 256 / 1024 tokens with MEGAMOE_FP8_GEMM1_V11_SMALL=0 / 1. (4) the tables, last.
#   source scripts/use_prebuilt.sh v11-gemm1-small .xfer/v11-gemm1-small && \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/v11-gemm1-small/scripts/gpu_v11_gemm1_small.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh v11-gemm1-small .xfer/v11-gemm1-small first}
budget_s=115; pack_name=v11_gemm1_small.tgz
source "$(dirname "$0")/device_steps.sh"
filter='GroupedGemmFp8.Gemm1*:GroupedGemmFp8.ScheduleVariantsGemm1AllTiles:GroupedGemmFp8.RejectsBadGemm1Packing'
filter+=':-GroupedGemmFp8.Gemm1TwoPass*'
step gtest_gemm1 55 "$B/tests/megamoe_tests_gpu" --gtest_filter="$filter"
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$logs/gtest_gemm1.log"
echo "v11 small vs v9 lines: $(grep -c 'gemm1 v11 small (TMA scales' "$logs/gtest_gemm1.log"), with differences:" \
  "$(grep 'gemm1 v11 small (TMA scales' "$logs/gtest_gemm1.log" | grep -vc ': 0 /')"
for round in 1 2; do
  for model in dsv3 ms4 qwen3-30b; do
    step "bench_${model}_$round" 25 "$B/megamoe" bench gemm --format fp8 --models "$model" --rows 8 16 32 48 64 \
      --experts 128 --gemm1-v9 off --gemm1-v11 both --gemm1-v11-small both --no-cublas --repeats 10 \
      --json "$logs/bench_${model}_$round.json"
  done
done
# (3, if the budget is left) the staged dsv3 FP8 layer on ONE rank (all 256 experts local), 256 / 1024 tokens = a mean
# of 8 / 32 rows per expert (the staged rows hint), v11 small off / on (MEGAMOE_FP8_GEMM1_V11_SMALL; GEMM 1 is v11 on
# the interleaved packing by default), alternating processes.
for cfg in 0 1 0 1; do
  n=$(( ${n:-0} + 1 ))
  step "layer_small${cfg}_$n" 20 env MEGAMOE_FP8_GEMM1_V11_SMALL=$cfg "$B/megamoe" bench layer --backend staged \
    --ranks 1 --preset dsv3 --format fp8_block --tokens 256,1024 --iters 5 --json "$logs/layer_small${cfg}_$n.json"
done
cp "$logs"/*.json "$logs"/gtest_gemm1.log "$out/" 2>/dev/null
print_summary
python3 - "$logs" <<'PY'
import glob, json, os, sys
runs = {}  # (model, rows) -> {"splitn": [us], "v11": [us], "small": [us]}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "bench_*.json"))):
    for r in json.load(open(p)):
        if r.get("gemm") != "gemm1" or "v11_small_us" not in r: continue
        v = runs.setdefault((r["model"], r["rows_per_expert"]), {})
        v.setdefault("splitn", []).append(r["us"])
        v.setdefault("v11", []).append(r["v11_us"])
        v.setdefault("small", []).append(r["v11_small_us"])
def best(xs):
    return min(xs) if xs else float("nan")
print("%-10s %5s | %10s %10s %10s | %8s %8s" % ("model", "rows", "splitN_us", "v11_us", "small_us", "x_splitN", "x_v11"))
for (model, rows), v in sorted(runs.items()):
    s, w, m = best(v["splitn"]), best(v["v11"]), best(v["small"])
    print("%-10s %5d | %10.1f %10.1f %10.1f | %8.3f %8.3f   (rounds: small %s)" % (model, rows, s, w, m, s / m, w / m,
          " ".join("%.1f" % x for x in v["small"])))
res = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "layer_small*.json"))):
    cfg = os.path.basename(f)[len("layer_small"):].split("_")[0]
    for r in json.load(open(f))["cases"]:
        ph = r.get("phases_us") or {}
        res.setdefault((r.get("tokens"), cfg), []).append("%d (g1 %d)" % (r["median_us"], ph.get("gemm1", 0)))
if res:
    print("layer staged dsv3 fp8, 1 rank, median us (GEMM 1 phase); small = MEGAMOE_FP8_GEMM1_V11_SMALL")
    for k in sorted(res): print("  tokens %5s small=%s: %s" % (k[0], k[1], "  ".join(res[k])))
print("GEMM 1, 128 experts, exact rows, best of the rounds (median of 10 launches each); splitN = the split-N "
      "tile on kGateUp weights (64 rows up to 56, 128 at 64), v11 = 128 x 256 on interleaved weights, small = "
      "v11 GEMM 1 small (64 x 256, split-N, interleaved); x = other us / small us (> 1: small faster)")
PY
