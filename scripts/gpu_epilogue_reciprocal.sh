#!/usr/bin/env bash
# One device call (ONE H200, <= 520 s): the GEMM-1 rows epilogue's FP8 requantization by one correctly rounded
# reciprocal per row (quotient_by_reciprocal, src/kernels/exact_quotient.h) instead of an IEEE division per element.
# It has no switch: the new build ($PREBUILT) runs side by side with the build before it ($OLD_PREBUILT) in alternating
# processes. Everything is packed into $OUT/epilogue_reciprocal.tgz after every step. Steps:
# (1) the whole one-GPU suite with the new build (both shards on GPU 0): the v9 / v11 GEMM-1 codes and scales must
#     equal the split-N kernel's (whose epilogue keeps __fdiv_rn) bit for bit, the W4A8 v10 GEMM 1 the old kernels'.
# (2) bench gemm --gemms 1, fp8, v11, 128 experts, 512 rows per expert, multinomial and exact, dsv3 ms4 qwen3-30b
#     dsv4-flash; and nvfp4 dsv3 (W4A8 v10 GEMM 1); old / new, two rounds.
# (3) bench layer, staged, one rank, dsv3 with 128 experts, fp8_block, 2048 and 8192 tokens, old / new, two rounds.
#   source scripts/use_prebuilt.sh OLD [SRC] && OLD=$PREBUILT && source scripts/use_prebuilt.sh NEW [SRC] &&
#   OLD_PREBUILT=$OLD PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_epilogue_reciprocal.sh
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?}; OLD_B=${OLD_PREBUILT:?}
budget_s=${BUDGET_S:-520}; pack_name=epilogue_reciprocal.tgz
source "$(dirname "$0")/device_steps.sh"
SHARD_GPUS="0 0" step_sharded_gpu_suite test_gpu "${SHARD_LIMIT:-330}" "$B/tests/megamoe_tests_gpu"
print_test_counts
grep -h "^\[  SKIPPED \]" "$logs"/test_gpu.log | sort -u
echo "v9 vs split-N lines: $(grep -c 'gemm1 v9 vs split-N' "$logs/test_gpu.log"), with differences:" \
  "$(grep 'gemm1 v9 vs split-N' "$logs/test_gpu.log" | grep -vc ': 0 /')"
export CUDA_VISIBLE_DEVICES=0
for round in 1 2; do
  for v in old new; do
    bin=$B/megamoe; [ "$v" = old ] && bin=$OLD_B/megamoe
    for spread in multinomial none; do
      step "bench_${spread}_${v}_$round" 40 "$bin" bench gemm --gemms 1 --format fp8 --gemm1-v9 on --gemm1-v11 on \
        --models dsv3 ms4 qwen3-30b dsv4-flash --experts 128 --rows 512 --rows-spread "$spread" --no-cublas \
        --repeats 10 --json "$logs/bench_${spread}_${v}_$round.json"
    done
    step "bench_nvfp4_${v}_$round" 30 "$bin" bench gemm --gemms 1 --format nvfp4 --models dsv3 --experts 128 \
      --rows 512 --rows-spread multinomial --no-cublas --repeats 10 --json "$logs/bench_nvfp4_${v}_$round.json"
    step "layer_${v}_$round" 40 "$bin" bench layer --backend staged --ranks 1 --preset dsv3 --experts 128 \
      --format fp8_block --tokens 2048,8192 --iters 10 --json "$logs/layer_${v}_$round.json"
  done
done
pack
print_summary
python3 - "$logs" <<'PY'
import glob, json, os, re, sys
d = sys.argv[1]
runs = {}
for p in sorted(glob.glob(os.path.join(d, "bench_*_*_*.json"))):
    m = re.match(r"bench_(\w+?)_(old|new)_(\d)\.json", os.path.basename(p))
    try: records = json.load(open(p))
    except Exception: continue
    for r in records:
        if r.get("gemm") != "gemm1": continue
        runs.setdefault((r["model"], r.get("format", ""), m.group(1)), {}).setdefault(m.group(2), []).append(r["us"])
best = lambda xs: min(xs) if xs else float("nan")
print("\nbench gemm GEMM 1, 128 experts, 512 rows per expert; best of 2 rounds; x = old_us / new_us (> 1: new faster)")
for key in sorted(runs):
    v = runs[key]; a, b = best(v.get("old", [])), best(v.get("new", []))
    print("%-10s %-10s %-11s | old %8.1f new %8.1f | x %.3f | %s" % (key + (a, b, a / b, " / ".join(
        " ".join("%.1f" % x for x in v.get(n, [])) for n in ("old", "new")))))
layer = {}
for p in sorted(glob.glob(os.path.join(d, "layer_*_*.json"))):
    m = re.match(r"layer_(old|new)_(\d)\.json", os.path.basename(p))
    try: doc = json.load(open(p))
    except Exception: continue
    for c in doc.get("cases", []):
        layer.setdefault(c["tokens"], {}).setdefault(m.group(1), []).append((c["median_us"], c.get("phases_us", {}).get("gemm1", 0)))
print("\nbench layer staged, 1 rank, dsv3 128 experts: median us (gemm1 phase us) per round; x = best old / best new median")
for t in sorted(layer):
    v = layer[t]; a = best([x[0] for x in v.get("old", [])]); b = best([x[0] for x in v.get("new", [])])
    print("tokens %5d | old %s | new %s | x %.3f" % (t, " ".join("%.0f (%.0f)" % x for x in v.get("old", [])),
          " ".join("%.0f (%.0f)" % x for x in v.get("new", [])), a / b))
PY
