#!/usr/bin/env python3
"""Table of a default-vs-variant GEMM bench (the one-call device scripts gpu_w4a8_v9.sh / gpu_w4a8_v10.sh).

usage: bench_variant_table.py LOGDIR NAME [GEMM]
Reads LOGDIR/bench_<format>_v<0|1>_<spread>_<round>.json (megamoe bench gemm --json; v0 = default, v1 = the
variant NAME), keeps the rows of GEMM (default gemm2) and prints per (format, model, rows, spread) the best TFLOP/s
of each side, variant / default, and the per-round ratios.
"""
import glob
import json
import os
import sys

logdir, name = sys.argv[1], sys.argv[2]
gemm = sys.argv[3] if len(sys.argv) > 3 else "gemm2"
runs = {}  # (format, model, rows, spread) -> {"0": [tflops per round], "1": [...]}
for p in sorted(glob.glob(os.path.join(logdir, "bench_*.json"))):
    switch = os.path.basename(p).split("_")[2][1:]
    try:
        rows = json.load(open(p))
    except (OSError, ValueError):
        continue  # a step cut by its limit leaves no (or a partial) file
    for r in rows:
        if r["gemm"] != gemm:
            continue
        key = (r.get("format"), r["model"], r["rows_per_expert"], r.get("rows_spread", "exact"))
        runs.setdefault(key, {}).setdefault(switch, []).append(r["tflops"])
print("%-6s %-10s %5s %-11s | %10s %10s | %7s  (rounds %s/default)" % (
    "format", "model", "rows", "spread", "default_TF", name + "_TF", name + "/def", name))
nan = float("nan")
for key, v in sorted(runs.items()):
    d, n = max(v.get("0", [nan])), max(v.get("1", [nan]))
    rounds = " ".join("%.3f" % (b / a) for a, b in zip(v.get("0", []), v.get("1", [])))
    print("%-6s %-10s %5d %-11s | %10.0f %10.0f | %7.3f  (%s)" % (key[0], key[1], key[2], key[3], d, n, n / d, rounds))
print("%s, 32 experts, best of the rounds (median of 10 launches each, L2 flushed); %s/def = %s TFLOP/s / default "
      "TFLOP/s (> 1: %s faster); multinomial rows = mean rows per expert" % (gemm.upper(), name, name, name))
