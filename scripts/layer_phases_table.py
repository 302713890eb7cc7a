# The layer_*.json of a device script's logs (megamoe bench layer --json): rank-0 median µs and the phase split.
#   python3 scripts/layer_phases_table.py LOGS
import glob, json, os, sys

print("\nbench layer, rank-0 median: layer us | phases us")
for f in sorted(glob.glob(os.path.join(sys.argv[1], "layer_*.json"))):
    try:
        cases = json.load(open(f))["cases"]
    except Exception as e:
        print(os.path.basename(f), "unreadable", e)
        continue
    for c in cases:
        ph = " ".join("%s %.0f" % (k, v) for k, v in c.get("phases_us", {}).items())
        print("%-24s %-18s tokens %5d  %8.1f us  %s" % (os.path.basename(f)[:-5], c.get("backend", ""), c["tokens"],
                                                        c["median_us"], ph))
