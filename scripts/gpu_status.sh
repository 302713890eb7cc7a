#!/usr/bin/env bash
# One device call (2 x H200, prebuilt binaries) for the figures behind the open speed targets that
# gpu_check.sh's other steps do not cover quickly, plus mega's sanitizer step, with one deadline:
#   source scripts/use_prebuilt.sh main && PREBUILT=$PREBUILT OUT=$OUT bash scripts/gpu_status.sh
# Phase 1 (both GPUs, side by side): GPU 0 bench gemm W4A8 (nvfp4, mxfp4) + BF16; GPU 1 mega memcheck +
# racecheck at a small shape (issue 5). Phase 2 (both GPUs): bench layer ms4 / qwen3-30b FP8 staged vs
# mega (issue 5: mega never > 5% slower), dsv3 FP8 beside the plain torch layer (issue 4: >= 3x), then
# dsv3 nvfp4 / mxfp4 staged vs mega (issue 5's W4A8 rows).
# Logs + JSON in one tgz ($OUT/status.tgz); table last.
set -uo pipefail
out=${OUT:-out}; mkdir -p "$out"; logs=$(mktemp -d)
B=${PREBUILT:?source scripts/use_prebuilt.sh NAME first}; cli=$B/megamoe; T=$B/tests
deadline=${DEADLINE_S:-560}; start=$(date +%s); summary=()
pack() { tar -czf "$out/status.tgz" -C "$logs" . 2>/dev/null; }
left() { echo $(( deadline - ($(date +%s) - start) )); }
step() {  # step NAME LIMIT command...: limit clamped to the deadline; logs/pass/fail/seconds recorded
  local name=$1 limit=$2; shift 2; local t0 rc=0 l; t0=$(date +%s); l=$(left)
  if [ "$l" -lt 15 ]; then summary+=("$name|skipped (deadline)|-"); return 1; fi
  [ "$limit" -gt "$l" ] && limit=$l
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  if [ $rc -eq 0 ]; then summary+=("$name|ok|$(( $(date +%s) - t0 ))s")
  else summary+=("$name|FAIL($rc)|$(( $(date +%s) - t0 ))s"); grep -E "FAILED|Failure|rror" "$logs/$name.log" | head -8; fi
  pack; return $rc
}
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >"$logs/gpus.txt"
rows="8 32 128 1024 4096"
(
  export CUDA_VISIBLE_DEVICES=0
  step bench_gemm_nvfp4 110 "$cli" bench gemm --format nvfp4 --models dsv3 qwen3-30b --rows $rows --json "$logs/bench_gemm_nvfp4.json"
  step bench_gemm_mxfp4 110 "$cli" bench gemm --format mxfp4 --models dsv3 qwen3-30b --rows $rows --json "$logs/bench_gemm_mxfp4.json"
  step bench_gemm_bf16 90 "$cli" bench gemm --format bf16 --models dsv3 qwen3-30b --rows 1024 4096 --json "$logs/bench_gemm_bf16.json"
  printf '%s\n' "${summary[@]}" >"$logs/summary.gpu0"
) &
gpu0=$!
(
  export CUDA_VISIBLE_DEVICES=1
  for tool in memcheck racecheck; do
    step "mega_$tool" 150 compute-sanitizer --tool "$tool" $([ "$tool" = memcheck ] && echo --report-api-errors no) --error-exitcode 1 "$T/megamoe_tests_gpu" \
      --gtest_filter="${MEGA_SANITIZE_FILTER:-MegaSingle.ZeroTokensAndChangingTokenCounts/fp8_block}"
  done
  printf '%s\n' "${summary[@]}" >"$logs/summary.gpu1"
) &
gpu1=$!
wait $gpu0 $gpu1
mapfile -t summary < <(cat "$logs"/summary.gpu0 "$logs"/summary.gpu1 2>/dev/null)
for preset in ms4 qwen3-30b; do
  step "layer_${preset}" 90 "$cli" bench layer --backend staged,mega --ranks 2 --preset "$preset" --format fp8_block \
    --tokens 128,512,2048,8192 --iters 10 --json "$logs/layer_${preset}.json"
done
# Issue 4's ">= 3x a plain PyTorch layer", side by side: dsv3 FP8 staged / mega, then the torch layer
# (bench/torch_moe_layer.py: NCCL all_to_all + torch._grouped_mm, and one torch.mm per expert, BF16).
step layer_dsv3_fp8 90 "$cli" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format fp8_block \
  --tokens 128,2048,8192 --iters 10 --json "$logs/layer_dsv3_fp8.json"
step torch_layer 150 python3 bench/torch_moe_layer.py --ranks 2 --preset dsv3 --tokens 128,2048,8192 --gemm grouped \
  --json "$logs/torch_layer_grouped.json"
step torch_layer_loop 90 python3 bench/torch_moe_layer.py --ranks 2 --preset dsv3 --tokens 8192 --gemm loop \
  --json "$logs/torch_layer_loop.json"
step layer_dsv3_nvfp4 200 "$cli" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format nvfp4 \
  --tokens 128,2048,8192 --iters 5 --json "$logs/layer_dsv3_nvfp4.json"
step layer_dsv3_mxfp4 120 "$cli" bench layer --backend staged,mega --ranks 2 --preset dsv3 --format mxfp4 \
  --tokens 128,8192 --iters 5 --json "$logs/layer_dsv3_mxfp4.json"
grep -h "ERROR SUMMARY" "$logs"/mega_*.log 2>/dev/null
for f in "$logs"/layer_*.json; do
  [ -f "$f" ] || continue
  python3 - "$f" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
rows = {}
for c in j["cases"]:
    rows.setdefault(c["tokens"], []).append("%s %.0f (%.2fx floor)" % (
        c["backend"], c["median_us"], c.get("ratio_to_floor", 0)))
print("==", j["shape"]["preset"], j.get("format", ""), sys.argv[1].rsplit("/", 1)[-1])
for t in sorted(rows): print("  %6d tok: %s" % (t, " | ".join(rows[t])))
PY
done
python3 - "$logs" <<'PY'
import json, os, sys
d = sys.argv[1]
def load(name):
    p = os.path.join(d, name)
    return json.load(open(p)) if os.path.exists(p) else None
ours, grouped, loop = load("layer_dsv3_fp8.json"), load("torch_layer_grouped.json"), load("torch_layer_loop.json")
if ours:
    torch_us = {}
    for j in (grouped, loop):
        for c in (j or {}).get("cases", []):
            torch_us.setdefault(c["tokens"], []).append((j["gemm"], c["slowest_rank_median_us"]))
    print("== dsv3 FP8 vs the plain torch layer (same call; torch = slowest rank's median)")
    for c in ours["cases"]:
        for gemm, t in torch_us.get(c["tokens"], []):
            print("  %6d tok  %-18s %8.0f us   torch[%s] %9.0f us   speed-up %.2fx" % (
                c["tokens"], c["backend"], c["median_us"], gemm, t, t / c["median_us"]))
PY
for f in "$logs"/bench_gemm_*.log; do [ -f "$f" ] && { echo "== $(basename "$f")"; grep -E "^\|" "$f" | head -24; }; done
printf '\n%-20s %-20s %s\n' step result time
for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-20s %-20s %s\n' "$a" "$b" "$c"; done
pack
