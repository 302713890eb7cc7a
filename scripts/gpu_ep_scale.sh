#!/usr/bin/env bash
# Issue 8 (EP4 / EP8) in ONE device call per machine kind, with binaries prebuilt on the dev machine
# (scripts/prebuild.sh NAME; nothing is compiled on the GPU machine):
#   source scripts/use_prebuilt.sh NAME [SOURCE-TREE] && RANKS=4 bash scripts/gpu_ep_scale.sh
# (kind nvidia-h200-x4 with RANKS=4, nvidia-h200-x8 with RANKS=8; carry .xfer/pre-NAME).
# Steps, in this order, each under `timeout` and skipped with a message when the BUDGET would be
# exceeded (the device tool ends a call at 600 s):
#   1. tests  the multigpu suites on RANKS ranks (MEGAMOE_TEST_RANKS): EpMulti.*, MegaMulti.*,
#             MoeWorkspaceMulti.* (the DP generate tests stay at 2 ranks; gpu_check.sh runs them)
#   2. fp8    `megamoe bench layer --ranks RANKS --backend staged,mega --format fp8_block` for each
#             preset of PRESETS (dsv3 dsv4-flash ms4) at TOKENS (8,128,2048,8192,16384 per rank)
#      then `megamoe bench ep --ranks RANKS` (dispatch + combine alone, dsv3 shape, 4096 tokens/rank)
#   3. nvfp4  the same with --format nvfp4 (W4A8), backend staged only (mega_capabilities(): mega
#             runs fp8_block and bf16 only)
#   4. mxfp4  the same with --format mxfp4 (MXFP4=0 skips it)
#   5. serve  only with SERVE=1: the prefill serving experiment DP$RANKS/EP$RANKS through
#             scripts/gpu_serve.sh (DP=$RANKS). It builds the server on the device (~420 s) and serves
#             twice, so it needs a call of its own: SERVE=1 TESTS=0 BENCH=0 bash scripts/gpu_ep_scale.sh
# Outputs (the device tool returns at most 8 files): $OUT/ep_scale_r$RANKS.tar.gz (every log and per-case
# JSON), $OUT/ep_scale_r$RANKS.json (all bench cases merged), $OUT/summary_r$RANKS.txt (the table
# printed last: staged / mega µs per case, mega/staged, and each one's ratio to the floor with the
# floor's compute / weight-read / NVLink terms, as `bench layer` reports them).
# env: RANKS (4; 2..8, <= visible GPUs), BUDGET (seconds for all steps, default 540), PRESETS, TOKENS,
#      ITERS (10), TESTS=0 / BENCH=0 skip steps 1 / 2-4, MXFP4=0, SERVE=1, MULTI_FILTER (gtest filter),
#      TEST_TIMEOUT (150: seconds one multigpu test may run before the launcher kills its ranks).
# If the call runs short, a second one finishes what was skipped: TESTS=0 (benchmarks only), PRESETS=...,
# MXFP4=0; the summary names every skipped step.
# Expected wall time (estimates, docs/ep_scale.md: no per-step timings of the 2-GPU runs are recorded;
# the bench's host setup was timed on the dev machine, 32 s for dsv3 on 2 slow cores):
#   tests ~120-250 s (12 tests, each bootstraps an NCCL group of RANKS processes, ~5-10 s, then small
#   layers; host references regenerate every rank's inputs); each bench layer run ~25-45 s (group
#   bootstrap, 8 distinct random experts quantized on the host, packing RANKS' share of E experts,
#   then 5 token counts x (1 + ITERS) forwards of <= ~25 ms each), 9 runs ~270-400 s, bench ep ~15 s.
#   Total ~400-660 s: the default BUDGET (540) leaves ~45 s of the 600 s call for use_prebuilt.sh, the
#   tar and the table; what does not fit is skipped from the end (mxfp4 first to go).
set -uo pipefail
cd "$(dirname "$0")/.."
ranks=${RANKS:-4}
budget=${BUDGET:-540}
iters=${ITERS:-10}
tokens=${TOKENS:-8,128,2048,8192,16384}
presets=${PRESETS:-dsv3 dsv4-flash ms4}
out=${OUT:-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
work=$(mktemp -d /tmp/ep-scale.XXXX)
t_start=$(date +%s)
summary=()
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -z "${PREBUILT:-}" ]; then
  echo "gpu_ep_scale: PREBUILT unset: run 'source scripts/use_prebuilt.sh NAME' first (scripts/prebuild.sh NAME on the dev machine)" >&2
  exit 1
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if ! [[ $ranks =~ ^[0-9]+$ ]] || [ "$ranks" -lt 2 ] || [ "$ranks" -gt 8 ]; then
  echo "gpu_ep_scale: RANKS=$ranks must be an integer in [2, 8]" >&2; exit 1
fi
if [ "$gpus" -lt "$ranks" ]; then
  echo "gpu_ep_scale: RANKS=$ranks needs $ranks GPUs, found $gpus (ask for kind nvidia-h200-x$ranks)" >&2; exit 1
fi
cli="$PREBUILT/megamoe"
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader; nvidia-smi topo -m; } \
  >"$work/gpus.txt" 2>&1
head -n "$ranks" "$work/gpus.txt"

# step NAME LIMIT MIN command...: runs `command` under timeout min(LIMIT, what is left of BUDGET);
# skipped with a message when less than MIN seconds are left. Output in $work/NAME.log.
step() {
  local name=$1 limit=$2 min=$3; shift 3
  local left=$(( budget - ($(date +%s) - t_start) ))
  if [ "$left" -lt "$min" ]; then
    summary+=("$name|skipped|needs ~${min}s, ${left}s of BUDGET=${budget}s left")
    echo "skip $name: needs ~${min}s, ${left}s of BUDGET=${budget}s left"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s) rc=0
  timeout -k 5 "$limit" "$@" >"$work/$name.log" 2>&1 || rc=$?
  local took=$(( $(date +%s) - t0 ))
  if [ $rc = 0 ]; then summary+=("$name|ok|${took}s")
  else summary+=("$name|FAIL($rc)|${took}s (limit ${limit}s)"); tail -25 "$work/$name.log"; fi
  echo "$name: rc $rc, ${took}s"
}

if [ "${TESTS:-1}" = 1 ]; then
  # A hung test's ranks are killed after TEST_TIMEOUT s (the launcher's limit), so one hang cannot use
  # up the call (EP waits are bounded at 5 s, so a broken protocol fails rather than hangs).
  step tests 300 90 env MEGAMOE_TEST_RANKS="$ranks" MEGAMOE_TEST_LAUNCH_TIMEOUT_S="${TEST_TIMEOUT:-150}" \
    "$PREBUILT/tests/megamoe_tests_multigpu" \
    --gtest_filter="${MULTI_FILTER:-EpMulti.*:MegaMulti.*:MoeWorkspaceMulti.*}"
fi
bench() {  # bench FORMAT BACKENDS PRESET
  local name="bench_${3}_${1}"
  step "$name" 120 30 "$cli" bench layer --ranks "$ranks" --preset "$3" --format "$1" --backend "$2" \
    --tokens "$tokens" --iters "$iters" --json "$work/$name.json"
}
if [ "${BENCH:-1}" = 1 ]; then
  for preset in $presets; do bench fp8_block staged,mega "$preset"; done
  # Dispatch + combine alone (dsv3 shape): remote GB/s per rank on RANKS ranks, to set beside the
  # floor's 370 GB/s NVLink assumption.
  step ep_dispatch 60 20 "$cli" bench ep --ranks "$ranks" --tokens 4096 --hidden 7168 --top-k 8 --experts 256 \
    --iters 20 --json "$work/ep_dispatch.json"
  for preset in $presets; do bench nvfp4 staged "$preset"; done
  if [ "${MXFP4:-1}" = 1 ]; then for preset in $presets; do bench mxfp4 staged "$preset"; done; fi
fi
if [ "${SERVE:-0}" = 1 ]; then
  step serve 590 500 env DP="$ranks" OUT="$work/serve" bash scripts/gpu_serve.sh
fi

# Merged JSON, summary table, one archive.
python3 - "$work" "$ranks" >"$work/summary.txt" <<'EOF'
import glob, json, os, sys
work, ranks = sys.argv[1], sys.argv[2]
runs = []
for path in sorted(glob.glob(os.path.join(work, "bench_*.json"))):
    try:
        runs.append(json.load(open(path)))
    except ValueError as e:
        print(f"unreadable {os.path.basename(path)}: {e}")
json.dump({"ranks": int(ranks), "runs": runs}, open(os.path.join(work, f"ep_scale_r{ranks}.json"), "w"), indent=1)
print(f"\nbench layer, {ranks} ranks (floor = max(compute, weight read, NVLink) per rank; x = time / floor)")
hdr = ("preset", "format", "tokens", "staged us", "x floor", "mega us", "x floor", "mega/staged", "floor us",
       "compute", "weights", "nvlink", "floor by")
print("| " + " | ".join(hdr) + " |")
print("|" + "|".join("---" for _ in hdr) + "|")
for run in runs:
    by_tokens = {}
    for c in run["cases"]:
        by_tokens.setdefault(c["tokens"], {})[c["backend"]] = c
    for t in sorted(by_tokens):
        cases = by_tokens[t]
        any_case = next(iter(cases.values()))
        s, m = cases.get("staged"), cases.get("mega")
        cell = lambda c, k, f: f.format(c[k]) if c else "-"
        print("| " + " | ".join([
            run["shape"]["preset"], run["format"], str(t),
            cell(s, "median_us", "{:.1f}"), cell(s, "ratio_to_floor", "{:.2f}"),
            cell(m, "median_us", "{:.1f}"), cell(m, "ratio_to_floor", "{:.2f}"),
            "{:.3f}".format(m["median_us"] / s["median_us"]) if s and m and s["median_us"] > 0 else "-",
            "{:.1f}".format(any_case["floor_us"]), "{:.1f}".format(any_case.get("floor_compute_us", 0)),
            "{:.1f}".format(any_case.get("floor_weights_us", 0)), "{:.1f}".format(any_case.get("floor_nvlink_us", 0)),
            any_case.get("floor_bound", "?")]) + " |")
EOF
# Test outcome: passed / skipped (a skip on the device means too few GPUs or a bad MEGAMOE_TEST_RANKS) / failed.
[ -f "$work/tests.log" ] && grep -h -E "^\[  (PASSED|SKIPPED|FAILED)  ?\] " "$work/tests.log" | grep -v " (0 ms)$" \
  | sort -u | head -30 >"$work/tests_summary.txt"
{
  echo "ep_scale: RANKS=$ranks BUDGET=${budget}s, $(( $(date +%s) - t_start ))s used, prebuilt $PREBUILT"
  cat "$work/tests_summary.txt" 2>/dev/null
  grep -h -A2 "^| mode | ranks" "$work/ep_dispatch.log" 2>/dev/null
  cat "$work/summary.txt"
  printf '\n%-26s %-9s %s\n' step result time
  for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-26s %-9s %s\n' "$a" "$b" "$c"; done
} >"$out/summary_r$ranks.txt"
cp "$work/ep_scale_r$ranks.json" "$out/" 2>/dev/null
tar -czf "$out/ep_scale_r$ranks.tar.gz" -C "$work" .
cat "$out/summary_r$ranks.txt"
