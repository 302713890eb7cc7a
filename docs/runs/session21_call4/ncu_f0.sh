#!/usr/bin/env bash
# Session 21 call 4: where the fold kernel's plain units lose 3.5-4% (docs/perf.md "Session 21"): ncu on v11 GEMM 1,
# dsv3, 128 experts, exact 512 rows (no tails), today's kernel (FOLD 0) vs the fold kernel without folding (FOLD 1,
# FOLD_ROWS 0): launch stats (grid, clusters, shared memory), warp stall reasons, instructions, tensor pipe.
B=${PREBUILT:?}; out=${OUT:-out}
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
m="gpu__time_duration.sum,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum"
m+=",launch__grid_size,launch__cluster_dim_x,launch__shared_mem_per_block_dynamic,launch__registers_per_thread"
m+=",smsp__warp_issue_stalled_no_instruction_per_warp_active.pct,smsp__warp_issue_stalled_wait_per_warp_active.pct"
m+=",smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_barrier_per_warp_active.pct"
m+=",smsp__warp_issue_stalled_membar_per_warp_active.pct,smsp__warp_issue_stalled_math_pipe_throttle_per_warp_active.pct"
m+=",smsp__warp_issue_stalled_short_scoreboard_per_warp_active.pct,smsp__warp_issue_stalled_sleeping_per_warp_active.pct"
m+=",smsp__warp_issue_stalled_branch_resolving_per_warp_active.pct,smsp__warp_issue_stalled_dispatch_stall_per_warp_active.pct"
m+=",smsp__warp_issue_stalled_mio_throttle_per_warp_active.pct,smsp__warp_issue_stalled_lg_throttle_per_warp_active.pct"
m+=",smsp__warp_issue_stalled_selected_per_warp_active.pct,smsp__warp_issue_stalled_not_selected_per_warp_active.pct"
m+=",smsp__warp_issue_stalled_misc_per_warp_active.pct,smsp__warp_issue_stalled_drain_per_warp_active.pct"
m+=",smsp__warp_issue_stalled_imc_miss_per_warp_active.pct,lts__t_sectors.sum,l1tex__m_xbar2l1tex_read_bytes.sum"
for v in off f0; do
  if [ $v = off ]; then envs="MEGAMOE_FP8_GEMM1_FOLD=0"; else envs="MEGAMOE_FP8_GEMM1_FOLD=1 MEGAMOE_FP8_GEMM1_FOLD_ROWS=0"; fi
  timeout 80 env $envs "$NCU" --clock-control none --kernel-name regex:sm90_fp8_wide_gemm1_kernel --launch-skip 1 \
    --launch-count 1 --metrics "$m" "$B/megamoe" bench gemm --gemms 1 --format fp8 --gemm1-v9 on --gemm1-v11 on \
    --models dsv3 --experts 128 --rows 512 --rows-spread none --no-cublas --repeats 2 > "$out/ncu_$v.txt" 2>&1
  echo "== $v rc=$?"
done
python3 - "$out" <<'PY'
import re, sys
vals = {}
for v in ("off", "f0"):
    for line in open(f"{sys.argv[1]}/ncu_{v}.txt", errors="replace"):
        m = re.match(r"\s+([a-z_][\w.]+)\s+(\S+)?\s+([\d,.]+)\s*$", line)
        if m: vals.setdefault(m.group(1), {})[v] = m.group(3)
print("%-70s %16s %16s" % ("metric", "off", "f0"))
for k in sorted(vals): print("%-70s %16s %16s" % (k, vals[k].get("off", "-"), vals[k].get("f0", "-")))
PY
