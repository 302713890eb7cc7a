#!/usr/bin/env bash
# Session 20 call 11: per-unit timeline of v11 GEMM 2 (1-CTA, BN 192: the default), dsv3, 128 experts, exact rows
# 384 / 392 / 448 / 512 / 520 and multinomial 512; and GEMM 1 at multinomial 512 again (same build).
B=${PREBUILT:?}; out=${OUT:-out}
for c in "384 none" "392 none" "448 none" "512 none" "520 none" "512 multinomial"; do
  set -- $c
  MEGAMOE_GEMM2_TIMELINE="$out/t2_${2}_$1.txt" timeout 60 "$B/megamoe" bench gemm --gemms 2 --format fp8 --fp8-v11 on \
    --models dsv3 --experts 128 --rows "$1" --rows-spread "$2" --no-cublas --repeats 2 > "$out/t2_${2}_$1.log" 2>&1
  echo "$1 $2 rc=$? lines=$(wc -l < "$out/t2_${2}_$1.txt" 2>/dev/null)"
done
python3 - "$out" <<'PY'
import glob, os, statistics, sys
d = sys.argv[1]
print("GEMM 2 per-unit time of math warpgroup 0 (us), 1-CTA; tile rows = min(128, m_end - m0)")
for f in sorted(glob.glob(os.path.join(d, "t2_*.txt"))):
    recs = []
    for line in open(f):
        p = line.split()
        if len(p) < 8: continue
        unit, rows, start, end, smid, shared, rank, block = map(int, p)
        if end <= start: continue
        recs.append((min(128, rows), (end - start) / 1000.0, start, end, block))
    if not recs: print(os.path.basename(f), "no records"); continue
    span = (max(r[3] for r in recs) - min(r[2] for r in recs)) / 1000.0
    groups = {}
    for rows, dur, *_ in recs:
        key = "full" if rows == 128 else "65-127" if rows > 64 else "<=64"
        groups.setdefault(key, []).append(dur)
    print("%-18s span %7.1f us | " % (os.path.basename(f)[3:-4], span) +
          " | ".join("%s n=%d med %.1f mean %.1f" % (k, len(v), statistics.median(v), statistics.mean(v))
                     for k, v in sorted(groups.items())))
PY
rm -f "$out"/t2_*.txt
