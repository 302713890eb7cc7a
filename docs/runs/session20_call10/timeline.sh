#!/usr/bin/env bash
# Session 20 call 10: per-unit timeline of v11 GEMM 1 (clusters of 2, the default) at exact rows 384 / 392 / 448 / 512 /
# 520 and multinomial 512 (dsv3, 128 experts). One process per case; the file holds its last launch.
B=${PREBUILT:?}; out=${OUT:-out}
for c in "384 none" "392 none" "448 none" "512 none" "520 none" "512 multinomial"; do
  set -- $c
  MEGAMOE_GEMM1_TIMELINE="$out/tl_${2}_$1.txt" timeout 60 "$B/megamoe" bench gemm --gemms 1 --format fp8 --gemm1-v9 on \
    --gemm1-v11 on --models dsv3 --experts 128 --rows "$1" --rows-spread "$2" --no-cublas --repeats 2 \
    > "$out/tl_${2}_$1.log" 2>&1
  echo "$1 $2 rc=$? lines=$(wc -l < "$out/tl_${2}_$1.txt" 2>/dev/null)"
done
python3 - "$out" <<'PY'
import glob, os, statistics, sys
d = sys.argv[1]
print("per-unit time of math warpgroup 0 (us): kind = pair (B shared) / lone; tile rows = min(128, m_end - m0)")
for f in sorted(glob.glob(os.path.join(d, "tl_*.txt"))):
    recs = []
    for line in open(f):
        p = line.split()
        if len(p) < 8: continue
        unit, rows, start, end, smid, shared, rank, block = map(int, p)
        if end <= start: continue
        recs.append((min(128, rows), shared, (end - start) / 1000.0, start, end, block))
    if not recs: print(os.path.basename(f), "no records"); continue
    span = (max(r[4] for r in recs) - min(r[3] for r in recs)) / 1000.0
    blocks = len(set(r[5] for r in recs))
    groups = {}
    for rows, shared, dur, *_ in recs:
        key = ("pair" if shared else "lone", "full" if rows == 128 else "part" if rows > 64 else "<=64")
        groups.setdefault(key, []).append(dur)
    busy = sum(r[2] for r in recs) / blocks
    print("%-22s span %7.1f us, %3d CTAs, mean busy %7.1f | " % (os.path.basename(f)[3:-4], span, blocks, busy) +
          " | ".join("%s/%s n=%d med %.1f mean %.1f" % (k[0], k[1], len(v), statistics.median(v), statistics.mean(v))
                     for k, v in sorted(groups.items())))
PY
