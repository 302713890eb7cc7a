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
  step "$name" "$limit" bash -c 'gpus=($2); pids=(); rc=0; for i in 0 1; do
      CUDA_VISIBLE_DEVICES=${gpus[$i]} GTEST_TOTAL_SHARDS=2 GTEST_SHARD_INDEX=$i "$0" >"$1.$i" 2>&1 & pids+=($!); done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done; cat "$1".*; exit $rc' "$tests" "$logs/$name.shard" "${SHARD_GPUS:-0 1}"
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
