#!/usr/bin/env bash
# One device call (ONE H200, <= 480 s): the v11 FP8 GEMMs with their B block scales by TMA (no scale warp):
# MEGAMOE_FP8_GEMM1_TMA_BSCALES (GEMM 1) and MEGAMOE_FP8_V11_TMA_BSCALES (plain / GEMM 2), both default 0 (the "TMA B
# scales" NOTES of sm90_fp8_wide_gemm1_kernel and sm90_fp8_wide_grouped_gemm_kernel). Variants: off = both 0, on = both
# 1. Everything is packed into $OUT/tma_bscales.tgz after every step. Steps (a step is cut to what is left):
# (1) GroupedGemmFp8.* (every v11 GEMM-1 run also with TMA B scales, plain and cluster, and every v11 plain / GEMM-2
#     run also in scale mode "1+b": codes, scales and BF16 outputs bit-identical to the other variants).
# (2) the one-GPU layer suites (EpSingle, MegaSingle, GpuStaged, MoeWorkspace) with both switches on: against the CPU
#     reference as always.
# (3) compute-sanitizer memcheck of Gemm1V11ManyTilesPerCta and V11ClusterMatchesNoCluster, switches on.
# (4) bench gemm --gemms 1 2, fp8, v11, dsv3 + ms4, 128 experts, 512 rows per expert, multinomial and exact; off / on in
#     alternating processes, two rounds.
# (5) bench layer, staged, one rank, dsv3 with 128 experts, fp8_block, 2048 and 8192 tokens, off / on, two rounds.
# (6) the tables.
# Knobs: WHOLE_SUITE=1 (the whole one-GPU suite at the defaults instead of (1)-(3); SHARD_LIMIT s, default 330),
# MODELS (bench gemm, default "dsv3 ms4"), ROUNDS (default 2), BUDGET_S (default 480).
#   source scripts/use_prebuilt.sh NAME [SRC] && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_tma_bscales.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}
budget_s=${BUDGET_S:-480}; pack_name=tma_bscales.tgz
source "$(dirname "$0")/device_steps.sh"
export CUDA_VISIBLE_DEVICES=0
on_env="MEGAMOE_FP8_GEMM1_TMA_BSCALES=1 MEGAMOE_FP8_V11_TMA_BSCALES=1"
off_env="MEGAMOE_FP8_GEMM1_TMA_BSCALES=0 MEGAMOE_FP8_V11_TMA_BSCALES=0"
if [ "${WHOLE_SUITE:-0}" = 1 ]; then
  # The whole one-GPU suite at the defaults (both shards on GPU 0), instead of steps (1)-(3).
  SHARD_GPUS="0 0" step_sharded_gpu_suite test_gpu "${SHARD_LIMIT:-330}" "$B/tests/megamoe_tests_gpu"
  print_test_counts
  grep -h "^\[  SKIPPED \]" "$logs"/test_gpu.log | sort -u
else
step gtest_fp8 150 "$B/tests/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.*'
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$logs/gtest_fp8.log"
echo "GEMM-1 tma-b vs v9 lines: $(grep -c 'tma-b (TMA scales' "$logs/gtest_fp8.log"), with differences:" \
  "$(grep 'tma-b (TMA scales' "$logs/gtest_fp8.log" | grep -vc ': 0 /')"
step gtest_layers_on 120 env $on_env "$B/tests/megamoe_tests_gpu" \
  --gtest_filter='EpSingle.*:*MegaSingle*:*GpuStaged*:*MoeWorkspace*'
grep -hE '^\[  (PASSED|FAILED) |^\[  FAILED  \]' "$logs/gtest_layers_on.log"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
step memcheck_on 60 env $on_env "$sanitizer" --tool memcheck --error-exitcode 1 "$B/tests/megamoe_tests_gpu" \
  --gtest_filter='GroupedGemmFp8.Gemm1V11ManyTilesPerCta:GroupedGemmFp8.V11ClusterMatchesNoCluster'
grep -hE "ERROR SUMMARY|PASSED|FAILED" "$logs/memcheck_on.log" | head -3
fi
bench_round() {
  local round=$1 spread v
  for spread in multinomial none; do
    for v in off on; do
      local e=$off_env; [ "$v" = on ] && e=$on_env
      step "bench_${spread}_${v}_$round" 40 env $e "$B/megamoe" bench gemm --gemms 1 2 --format fp8 --gemm1-v9 on \
        --gemm1-v11 on --models ${MODELS:-dsv3 ms4} --experts 128 --rows 512 --rows-spread "$spread" --no-cublas --repeats 10 \
        --json "$logs/bench_${spread}_${v}_$round.json"
    done
  done
}
layer_round() {
  local round=$1 v
  for v in off on; do
    local e=$off_env; [ "$v" = on ] && e=$on_env
    step "layer_${v}_$round" 40 env $e "$B/megamoe" bench layer --backend staged --ranks 1 --preset dsv3 --experts 128 \
      --format fp8_block --tokens 2048,8192 --iters 10 --json "$logs/layer_${v}_$round.json"
  done
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  bench_round "$round"
  layer_round "$round"
done
pack
print_summary
python3 - "$logs" <<'PY'
import glob, json, os, re, sys
d = sys.argv[1]
runs = {}
for p in sorted(glob.glob(os.path.join(d, "bench_*_*_*.json"))):
    m = re.match(r"bench_(\w+?)_(off|on)_(\d)\.json", os.path.basename(p))
    try: records = json.load(open(p))
    except Exception: continue
    for r in records:
        key = (r.get("gemm"), r["model"], m.group(1))
        runs.setdefault(key, {}).setdefault(m.group(2), []).append(r["us"])
print("\nbench gemm fp8 v11, 128 experts, 512 rows per expert; best of the rounds (median of 10 launches each);"
      " x = off_us / on_us (> 1: TMA B scales faster)")
print("%-6s %-6s %-11s | %8s %8s | %6s | %s" % ("gemm", "model", "rows", "off_us", "on_us", "x", "rounds off / on us"))
best = lambda xs: min(xs) if xs else float("nan")
for key in sorted(runs, key=str):
    v = runs[key]
    a, b = best(v.get("off", [])), best(v.get("on", []))
    print("%-6s %-6s %-11s | %8.1f %8.1f | %6.3f | %s" % (key[0], key[1], key[2], a, b, a / b,
          " / ".join(" ".join("%.1f" % x for x in v.get(n, [])) for n in ("off", "on"))))
layer = {}
for p in sorted(glob.glob(os.path.join(d, "layer_*_*.json"))):
    m = re.match(r"layer_(off|on)_(\d)\.json", os.path.basename(p))
    try: doc = json.load(open(p))
    except Exception: continue
    for r in (doc if isinstance(doc, list) else doc.get("results", doc.get("cases", []))):
        tokens = r.get("tokens_per_rank", r.get("tokens"))
        us = r.get("us", r.get("median_us", r.get("rank0_median_us")))
        if tokens is None or us is None: continue
        layer.setdefault(tokens, {}).setdefault(m.group(1), []).append(us)
print("\nbench layer staged, 1 rank, dsv3 128 experts, fp8_block: rank-0 median us per round; x = best off / best on")
for t in sorted(layer):
    v = layer[t]
    a, b = best(v.get("off", [])), best(v.get("on", []))
    print("tokens %5s | off %s | on %s | x %.3f" % (t, " ".join("%.0f" % x for x in v.get("off", [])),
          " ".join("%.0f" % x for x in v.get("on", [])), a / b))
PY
