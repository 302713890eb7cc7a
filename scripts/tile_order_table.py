# Table of scripts/gpu_tile_order.sh / gpu_tile_rotate.sh: bench gemm and bench layer, tile order 0 / 1.
#   python3 scripts/tile_order_table.py LOGS
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
