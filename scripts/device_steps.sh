# Shared steps of the one-call device scripts (scripts/gpu_*.sh). Source it after setting
#   out        the folder whose files come back ($OUT)
#   logs       a scratch folder for the step logs (packed into $out/$pack_name after every step)
#   budget_s   seconds the whole script may take (steps are cut to what is left, skipped below 10 s)
#   pack_name  the tgz name in $out
# Then:  step NAME LIMIT CMD...   (CMD's output in $logs/NAME.log; a failure prints its first error lines)
#        step_sharded_gpu_suite NAME LIMIT TESTS   (a gtest binary in two shards on GPUs $SHARD_GPUS (default 0 1), both shards' output
#                                 in $logs/NAME.log)
#        print_test_counts        (the PASSED / FAILED lines of every $logs/test_*.log)
#        print_summary            (the step / result / time table, last in the output)
summary=()
device_steps_start=$(date +%s)
pack() { tar -czf "$out/$pack_name" -C "$logs" . 2>/dev/null; }
step() {
  local name=$1 limit=$2; shift 2
  local t0 rc=0 left
  t0=$(date +%s)
  left=$(( budget_s - (t0 - device_steps_start) ))
  [ "$left" -lt 10 ] && { summary+=("$name|skipped|-"); return 1; }
  [ "$limit" -gt "$left" ] && limit=$left
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
  summary+=("$name|$([ $rc -eq 0 ] && echo ok || echo "FAIL($rc)")|$(( $(date +%s) - t0 ))s")
  [ $rc -ne 0 ] && grep -E "FAILED|Failure|rror" "$logs/$name.log" | head -10
  pack
  return $rc
}
print_summary() {
  printf '\n%-24s %-12s %s\n' step result time
  local row a b c
  for row in "${summary[@]}"; do IFS='|' read -r a b c <<<"$row"; printf '%-24s %-12s %s\n' "$a" "$b" "$c"; done
}
step_sharded_gpu_suite() {
  local name=$1 limit=$2 tests=$3
  # SHARD_GPUS: the GPU of each shard (default "0 1"; on a one-GPU machine "0 0" runs both shards on GPU 0).
  # SHARD_FILTER: a gtest filter for both shards; by default the in-process multi-rank suites (Ranks/EpLoopback.*,
  # ~4 min on one H200) are left to scripts/gpu_loopback.sh, so the shards keep their session-16 step limits.
  step "$name" "$limit" bash -c 'gpus=($2); pids=(); rc=0; for i in 0 1; do
      CUDA_VISIBLE_DEVICES=${gpus[$i]} GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i GTEST_FILTER="$3" "$0" >"$1.$i" 2>&1 &
      pids+=($!); done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done; cat "$1".*; exit $rc' "$tests" "$logs/$name.shard" "${SHARD_GPUS:-0 1}" \
    "${SHARD_FILTER:--Ranks/EpLoopback.*}"
}
print_test_counts() { grep -hE "^\[  (PASSED|FAILED) |^\[  FAILED  \]" "$logs"/test_*.log | sort | uniq -c; }
# The bench ep rows of every $logs/ep_*.log (rank 0): dispatch / combine µs and GB/s, then the per-kernel split.
print_ep_table() {
  echo; echo "bench ep (rank 0): case | dispatch us GB/s | combine us GB/s | kernels us: layout / send / receive / combine send / reduce"
  local f d kt
  for f in "$logs"/ep_*.log; do
    [ -f "$f" ] || continue
    d=$(grep -m1 '^| dispatch+combine' "$f" | awk -F'|' '{printf "%s %s | %s %s", $8, $9, $10, $11}')
    kt=$(grep -m1 '^| kernels us' "$f" | awk -F'|' '{printf "%s /%s /%s /%s /%s", $3, $4, $5, $6, $7}')
    echo "$(basename "$f" .log) | $d | $kt"
  done
}
# SM clock / power / clock-event reasons of GPU 0 every 50 ms (read-only nvidia-smi; session 17 found the H200 at its
# 700 W software cap, SM clock ~1.46 GHz instead of 1.98, under sustained large-M GEMM load). Usage:
#   clock_sampler_start; clock_mark NAME start; step NAME ...; clock_mark NAME end; ...; clock_sampler_stop
#   print_clock_table   (per marked step: the samples drawing >= 60% of the step's peak power, i.e. while kernels run)
clock_sampler_start() {
  local reasons=clocks_event_reasons.active
  nvidia-smi --query-gpu=$reasons --format=csv,noheader >/dev/null 2>&1 || reasons=clocks_throttle_reasons.active
  nvidia-smi -i 0 --query-gpu=timestamp,clocks.sm,power.draw,$reasons --format=csv,noheader,nounits -lms 50 \
    >"$logs/clocks.csv" 2>&1 &
  clock_sampler_pid=$!
}
clock_mark() { echo "$1 $2 $(date '+%Y/%m/%d %H:%M:%S.%3N')" >>"$logs/marks.txt"; }
clock_sampler_stop() { kill "${clock_sampler_pid:-0}" 2>/dev/null; wait "${clock_sampler_pid:-0}" 2>/dev/null; pack; }
print_clock_table() {
  python3 - "$logs" <<'PY'
import datetime, os, sys
d = sys.argv[1]
def t(s): return datetime.datetime.strptime(s.strip(), "%Y/%m/%d %H:%M:%S.%f")
samples, marks = [], {}
try:
    for line in open(os.path.join(d, "clocks.csv")):
        p = [x.strip() for x in line.split(",")]
        try: samples.append((t(p[0]), float(p[1]), float(p[2]), int(p[3], 16)))
        except Exception: pass
    for line in open(os.path.join(d, "marks.txt")):
        name, what, stamp = line.split(" ", 2)
        marks.setdefault(name, {})[what] = t(stamp)
except OSError as e:
    print("clock table:", e); sys.exit(0)
print("\nGPU 0 while loaded (samples >= 60% of the step's peak power): step | samples | SM MHz median / min | W median"
      " / max | share with the SW power cap (0x4)")
for name in sorted(marks, key=lambda n: marks[n].get("start", datetime.datetime.min)):
    m = marks[name]
    s = [x for x in samples if "start" in m and "end" in m and m["start"] <= x[0] <= m["end"]]
    if not s: print("%-24s no samples" % name); continue
    peak = max(x[2] for x in s); s = [x for x in s if x[2] >= 0.6 * peak]
    mhz = sorted(x[1] for x in s); w = sorted(x[2] for x in s)
    print("%-24s %4d | %5.0f / %5.0f | %4.0f / %4.0f | %.2f" % (name, len(s), mhz[len(mhz) // 2], mhz[0],
          w[len(w) // 2], w[-1], sum(1 for x in s if x[3] & 0x4) / len(s)))
PY
}
# After ncu profiles NAME.details.txt / NAME.raw.txt in $logs: per point the details lines matching PATTERN (first
# HEAD_LINES), the STALLS largest stall reasons (cycles per issued instruction) and, if given, the raw metrics
# matching RAW_PATTERN (name and value).
#   print_ncu_summary PATTERN HEAD_LINES STALLS [RAW_PATTERN]
print_ncu_summary() {
  local f
  for f in "$logs"/*.details.txt; do
    echo "== $(basename "$f" .details.txt)"
    grep -E "$1" "$f" | head -"$2"
    grep -E "smsp__average_warps?_issue_stalled_[a-z_]+_per_issue_active.ratio" "${f%.details.txt}.raw.txt" | \
      awk '{print $NF, $1}' | sort -rn | head -"$3"
    [ -n "${4:-}" ] && grep -E "$4" "${f%.details.txt}.raw.txt" | awk '{print $1, $NF}'
  done
  return 0
}
# Nsight Compute (scripts/gpu_ncu_*.sh). ncu_setup finds the binary (into ncu_bin). ncu_profile NAME KERNEL-REGEX
# LIMIT CMD... profiles the second launch of a kernel matching KERNEL-REGEX in CMD (one warm-up) and writes
# $logs/NAME.details.txt, NAME.raw.txt and NAME.sass.csv.gz (SASS lines with their stall samples) for
# print_ncu_summary.
# NOTES: --clock-control none: METHOD.md leaves the clocks alone (the figures are at the clock the card really runs,
# power-capped at large M); one launch, since SourceCounters replays the kernel many times.
ncu_setup() {
  ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  echo "ncu: $ncu_bin"
}
ncu_profile() {
  local name=$1 kernel=$2 limit=$3; shift 3
  timeout "$limit" "$ncu_bin" --clock-control none --kernel-name "regex:$kernel" --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
    --section LaunchStats --section Occupancy --section SourceCounters --import-source no \
    -o "$logs/$name" "$@" >"$logs/$name.run.log" 2>&1
  echo "$name rc=$?"
  "$ncu_bin" --import "$logs/$name.ncu-rep" --page details --print-units base >"$logs/$name.details.txt" 2>&1
  "$ncu_bin" --import "$logs/$name.ncu-rep" --page raw --print-units base >"$logs/$name.raw.txt" 2>&1
  "$ncu_bin" --import "$logs/$name.ncu-rep" --page source --print-source sass --csv >"$logs/$name.sass.csv" 2>&1
  gzip -f "$logs/$name.sass.csv"
}
