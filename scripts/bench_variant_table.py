#!/usr/bin/env python3
"""Table of a baseline-vs-variant GEMM bench (the one-call device scripts, e.g. gpu_w4a8_v10.sh).

usage: bench_variant_table.py LOGDIR NAME [GEMM [BASE]]
Reads LOGDIR/bench_<format>_v<S>_<spread>_<round>.json (megamoe bench gemm --json; S = the switch value: 0 = the
baseline, named BASE (default "default"), any other value a variant of NAME), keeps the rows of GEMM (default gemm2)
and prints per (format, model, rows, spread) the best TFLOP/s of each switch value and each variant / baseline, then
the per-round ratios.
"""
import glob
import json
import os
import sys

logdir, name = sys.argv[1], sys.argv[2]
gemm = sys.argv[3] if len(sys.argv) > 3 else "gemm2"
base = sys.argv[4] if len(sys.argv) > 4 else "default"
runs = {}  # (format, model, rows, spread) -> {switch: [tflops per round]}
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
variants = sorted({s for v in runs.values() for s in v if s != "0"})
label = lambda s: name if len(variants) == 1 else "%s=%s" % (name, s)
ratio = "/" + base[:3]
head = "%-6s %-10s %5s %-11s | %10s" % ("format", "model", "rows", "spread", base + "_TF")
for s in variants:
    head += " %10s %8s" % (label(s) + "_TF", ratio)
print(head + "  (rounds variant/%s)" % base)
nan = float("nan")
for key, v in sorted(runs.items()):
    d = max(v.get("0", [nan]))
    line = "%-6s %-10s %5d %-11s | %10.0f" % (key[0], key[1], key[2], key[3], d)
    rounds = []
    for s in variants:
        n = max(v.get(s, [nan]))
        line += " %10.0f %8.3f" % (n, n / d)
        rounds.append(" ".join("%.3f" % (b / a) for a, b in zip(v.get("0", []), v.get(s, []))))
    print(line + "  (" + " | ".join(rounds) + ")")
print("%s, 32 experts, best of the rounds (median of 10 launches each, L2 flushed); %s = variant TFLOP/s / %s "
      "TFLOP/s (> 1: the variant is faster); multinomial rows = mean rows per expert" % (gemm.upper(), ratio, base))
