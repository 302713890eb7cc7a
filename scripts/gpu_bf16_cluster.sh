#!/usr/bin/env bash
# One device call (ONE H200, <= 200 s): the BF16 v2 wide kernel in clusters of 2 (MEGAMOE_BF16_CLUSTER=1: the two
# CTAs of a cluster share each 256 x 64 B tile by TMA multicast; docs/grouped_gemm.md "BF16 clusters"). Prebuilt:
# scripts/prebuild.sh bf16-cluster /work/main from /work/wt/bf16-cluster; carry .xfer/pre-bf16-cluster and the
# branch's tree as .xfer/bf16-cluster (git -C /work/wt/bf16-cluster archive bf16-cluster | tar -x -C
# /work/main/.xfer/bf16-cluster), then from the root:
#   source scripts/use_prebuilt.sh bf16-cluster .xfer/bf16-cluster && \
#     PREBUILT=$PREBUILT OUT=$OUT bash .xfer/bf16-cluster/scripts/gpu_bf16_cluster.sh
# (or, once merged: source scripts/use_prebuilt.sh bf16-cluster && OUT=$OUT bash scripts/gpu_bf16_cluster.sh)
# (1) GroupedGemmBf16.* with the switch on in the environment (every v2 run then takes the cluster kernel and must
# stay bit-identical to v1; V2ClusterMatchesNoCluster / V2Gemm1ClusterMatchesNoCluster toggle it themselves: cluster
# 1 vs 0 bit for bit on odd m-tile counts, 1-tile and empty experts, 1 / 3 / 7 n-tiles); (2) bench gemm bf16 (v2:
# GEMM 1 on the interleaved weights, GEMM 2 wide), 128 experts, dsv3 / ms4 / qwen3-30b, exact rows 1024 / 4096 and
# multinomial means 256 / 512 / 1024, cluster 0 / 1 in alternating processes, two rounds (round 1 with cuBLAS BF16 in
# the same process, round 2 without). Steps in priority order: the budget cuts the last ones. Table last.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh bf16-cluster first}; T=$B/tests
budget_s=${BUDGET_S:-200}; pack_name=bf16_cluster.tgz
source "$(dirname "$0")/device_steps.sh"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | head -1
step test_bf16_cluster 70 env MEGAMOE_BF16_CLUSTER=1 "$T/megamoe_tests_gpu" --gtest_filter='GroupedGemmBf16.*'
print_test_counts
bench() {  # NAME CLUSTER ARGS...
  local name=$1 cluster=$2; shift 2
  step "$name" 30 env MEGAMOE_BF16_CLUSTER="$cluster" "$B/megamoe" bench gemm --format bf16 --bf16-v2 on \
    --models dsv3 ms4 qwen3-30b --experts 128 --repeats 10 "$@" --json "$logs/$name.json"
}
for c in 0 1; do bench "exact_c${c}_1" "$c" --rows 1024 4096; done
for c in 0 1; do bench "spread_c${c}_1" "$c" --rows 256 512 1024 --rows-spread multinomial; done
for c in 0 1; do bench "exact_c${c}_2" "$c" --rows 1024 4096 --no-cublas; done
for c in 0 1; do bench "spread_c${c}_2" "$c" --rows 256 512 1024 --rows-spread multinomial --no-cublas; done
print_summary
python3 - "$logs" <<'PY'
import glob, json, math, os, sys
d = sys.argv[1]
g = {}
for f in sorted(glob.glob(os.path.join(d, "*.json"))):
    kind, c, rnd = os.path.basename(f)[:-5].split("_")
    try: rows = json.load(open(f))
    except Exception as e: print(f, e); continue
    for r in (rows if isinstance(rows, list) else rows.get("results", [])):
        k = (kind, r["model"], r["gemm"], r["rows_per_expert"])
        g.setdefault(k, {}).setdefault(c, []).append((r["us"], r.get("tflops", float("nan"))))
        cb = r.get("cublas_bf16_us", 0) or 0
        if cb > 0 and math.isfinite(cb): g[k].setdefault("cublas", []).append((cb, r.get("cublas_bf16_tflops", float("nan"))))
print("bench gemm bf16 v2, 128 experts: best us (TFLOP/s) of two rounds per MEGAMOE_BF16_CLUSTER; x = c0 / c1 (> 1: "
      "cluster faster); cuBLAS BF16 (round 1, best of both processes)")
nan = (float("nan"), float("nan"))
for k in sorted(g):
    a = min(g[k].get("c0", [nan])); b = min(g[k].get("c1", [nan])); cb = min(g[k].get("cublas", [nan]))
    print("%-6s %-10s %-6s %5d | c0 %9.1f (%6.1f) | c1 %9.1f (%6.1f) | x %.3f | cuBLAS %9.1f (%6.1f)" % (
        k + (a[0], a[1], b[0], b[1], a[0] / b[0] if b[0] == b[0] else float("nan"), cb[0], cb[1])))
PY
pack
