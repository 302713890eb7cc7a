#!/usr/bin/env bash
# One device call (2 x H200, <= 540 s): may MEGAMOE_GEMM_M_FASTEST=1 (v11 tiles m-fastest inside an expert,
# docs/grouped_gemm.md "Tile order") become the default? Prebuilt: scripts/prebuild.sh main; carry .xfer/pre-main as a tgz.
#   source scripts/use_prebuilt.sh main && OUT=$OUT bash scripts/gpu_tile_order.sh
# (1) the whole one-GPU suite (sharded over both GPUs) and (2) the whole 2-rank suite, both with the switch ON;
# (3) bench gemm fp8, 128 experts, rows per expert multinomial at means 256 / 512 / 1024, dsv3 / ms4 / qwen3-30b,
# switch 0 / 1 in alternating processes, two rounds; (4) bench layer FP8 on 2 ranks, staged + mega, dsv3 at 2048 / 8192
# tokens (two rounds) and ms4 / qwen3-30b (one round), 0 / 1 alternating. Table last.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh main first}; T=$B/tests
budget_s=${BUDGET_S:-540}; pack_name=tile_order.tgz
source scripts/device_steps.sh
export MEGAMOE_GEMM_M_FASTEST=1
step_sharded_gpu_suite test_gpu 190 "$T/megamoe_tests_gpu"
step test_multigpu 240 env MEGAMOE_TEST_RANKS=2 "$T/megamoe_tests_multigpu"
print_test_counts
for round in 1 2; do for mf in 0 1; do
  step "gemm_m${mf}_$round" 25 env MEGAMOE_GEMM_M_FASTEST=$mf "$B/megamoe" bench gemm --format fp8 \
    --models dsv3 ms4 qwen3-30b --rows 256 512 1024 --experts 128 --rows-spread multinomial --no-cublas --repeats 10 \
    --json "$logs/gemm_m${mf}_$round.json"
done; done
for round in 1 2; do for mf in 0 1; do
  for model in dsv3 ms4 qwen3-30b; do
    [ "$round" = 2 ] && [ "$model" != dsv3 ] && continue
    step "layer_${model}_m${mf}_$round" 45 env MEGAMOE_GEMM_M_FASTEST=$mf "$B/megamoe" bench layer --backend staged,mega \
      --ranks 2 --preset "$model" --format fp8_block --tokens 2048,8192 --iters 6 --json "$logs/layer_${model}_m${mf}_$round.json"
  done
done; done
print_summary
python3 - "$logs" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
g = {}
for f in sorted(glob.glob(os.path.join(d, "gemm_m*.json"))):
    mf = os.path.basename(f)[6]
    try: rows = json.load(open(f))
    except Exception as e: print(f, e); continue
    for r in (rows if isinstance(rows, list) else rows.get("results", [])):
        g.setdefault((r["model"], r["gemm"], r["rows_per_expert"]), {}).setdefault(mf, []).append(r["us"])
print("bench gemm fp8, 128 experts, multinomial rows: best us  n-fastest (0) / m-fastest (1)   x = 0 / 1")
for k in sorted(g):
    a, b = min(g[k].get("0", [float("nan")])), min(g[k].get("1", [float("nan")]))
    print("%-10s %-6s %5d | %9.1f %9.1f | %.3f" % (k[0], k[1], k[2], a, b, a / b))
res = {}
for f in sorted(glob.glob(os.path.join(d, "layer_*.json"))):
    model, mf, rnd = os.path.basename(f)[6:-5].rsplit("_", 2)
    try: cases = json.load(open(f))["cases"]
    except Exception as e: print(f, e); continue
    for c in cases:
        res.setdefault((model, c["tokens"], c["backend"]), {}).setdefault(mf, []).append(c["median_us"])
print("layer fp8, 2 ranks, rank-0 median us per round: m0 | m1")
for k in sorted(res):
    print("%-10s %6s %-18s %s | %s" % (k[0], k[1], k[2], " ".join("%.0f" % x for x in res[k].get("m0", [])),
          " ".join("%.0f" % x for x in res[k].get("m1", []))))
PY
pack
