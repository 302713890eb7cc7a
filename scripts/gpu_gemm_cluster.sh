#!/usr/bin/env bash
# One device call (ONE H200, <= 200 s): the v11 cluster kernels (MEGAMOE_GEMM_CLUSTER=1: clusters of 2 CTAs share each
# B tile by TMA multicast; docs/grouped_gemm.md "v11 clusters"). Prebuilt: scripts/prebuild.sh gemm-cluster /work/main
# from /work/wt/gemm-cluster; carry .xfer/pre-gemm-cluster and the branch's tree as .xfer/gemm-cluster
# (git -C /work/wt/gemm-cluster archive gemm-cluster | tar -x -C /work/main/.xfer/gemm-cluster), then from the root:
#   source scripts/use_prebuilt.sh gemm-cluster .xfer/gemm-cluster && \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/gemm-cluster/scripts/gpu_gemm_cluster.sh
# (or, once merged: source scripts/use_prebuilt.sh gemm-cluster && OUT=$OUT bash scripts/gpu_gemm_cluster.sh)
# (1) GroupedGemmFp8.* with the switch on in the environment (the v11 runs also toggle it themselves: GEMM 2 must be
# bit-identical to the v8-v10 kernel and V11ClusterMatchesNoCluster cluster 1 to 0; GEMM 1 to v9), then the v11
# cases again with MEGAMOE_GEMM_M_FASTEST=1 too; (2) bench gemm fp8, 128 experts, GEMM 1 = v11 (the
# interleaved weights), GEMM 2 = v11 (library default): multinomial rows at means 256 / 512 / 1024 and exact rows
# 1024 / 4096, dsv3 / ms4 / qwen3-30b, cluster 0 / 1 in alternating processes, two rounds, then the same with
# M_FASTEST=1 (one round). Steps in priority order: the budget cuts the last ones. Table last.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh gemm-cluster first}; T=$B/tests
budget_s=${BUDGET_S:-200}; pack_name=gemm_cluster.tgz
source "$(dirname "$0")/device_steps.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | head -1
step test_cluster 80 env MEGAMOE_GEMM_CLUSTER=1 "$T/megamoe_tests_gpu" --gtest_filter='GroupedGemmFp8.*'
step test_cluster_mf 40 env MEGAMOE_GEMM_CLUSTER=1 MEGAMOE_GEMM_M_FASTEST=1 "$T/megamoe_tests_gpu" \
  --gtest_filter='GroupedGemmFp8.V11*:GroupedGemmFp8.Gemm1V11ManyTilesPerCta:GroupedGemmFp8.Gemm1DeepHidden'
print_test_counts
bench() {  # NAME CLUSTER M_FASTEST ARGS...
  local name=$1 cluster=$2 mf=$3; shift 3
  step "$name" 30 env MEGAMOE_GEMM_CLUSTER="$cluster" MEGAMOE_GEMM_M_FASTEST="$mf" "$B/megamoe" bench gemm --format fp8 \
    --models dsv3 ms4 qwen3-30b --experts 128 --gemm1-v9 on --gemm1-v11 on --no-cublas --repeats 10 "$@" \
    --json "$logs/$name.json"
}
for round in 1 2; do
  for c in 0 1; do bench "spread_c${c}_m0_$round" "$c" 0 --rows 256 512 1024 --rows-spread multinomial; done
  for c in 0 1; do bench "exact_c${c}_m0_$round" "$c" 0 --rows 1024 4096; done
done
for c in 0 1; do bench "spread_c${c}_m1_1" "$c" 1 --rows 256 512 1024 --rows-spread multinomial; done
for c in 0 1; do bench "exact_c${c}_m1_1" "$c" 1 --rows 1024 4096; done
print_summary
python3 - "$logs" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
g = {}
for f in sorted(glob.glob(os.path.join(d, "*.json"))):
    kind, c, mf, rnd = os.path.basename(f)[:-5].split("_")
    try: rows = json.load(open(f))
    except Exception as e: print(f, e); continue
    for r in (rows if isinstance(rows, list) else rows.get("results", [])):
        g.setdefault((kind, mf, r["model"], r["gemm"], r["rows_per_expert"]), {}).setdefault(c, []).append(
            (r["us"], r.get("tflops", float("nan"))))
print("bench gemm fp8, 128 experts (v11 GEMM 1 and 2): best us (TFLOP/s) per cluster switch; x = c0 / c1 (> 1: cluster faster)")
for k in sorted(g):
    a = min(g[k].get("c0", [(float("nan"), float("nan"))]))
    b = min(g[k].get("c1", [(float("nan"), float("nan"))]))
    print("%-6s %-2s %-10s %-6s %5d | %9.1f (%6.1f) %9.1f (%6.1f) | %.3f" % (k + (a[0], a[1], b[0], b[1], a[0] / b[0])))
PY
pack
