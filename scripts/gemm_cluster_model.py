#!/usr/bin/env python3
# Host-side models of the v11 cluster kernels (docs/grouped_gemm.md "v11 clusters"), no GPU needed:
# (1) the schedule: locate_cluster_tile (sm90_grouped_schedule.cuh) transcribed; over random expert row counts and
#     n-tile counts, both orders, every (expert, m-tile, n-tile) is computed exactly once, both CTAs of a unit agree on
#     shared_b, and a pair's CTAs hold m-tiles 2p, 2p + 1 of the same n-tile;
# (2) the barrier protocol: 2 CTAs x (producer, scale warp, 8 math warps), mbarrier phases / pending arrivals /
#     tx-count as PTX defines them, TMA bytes and cp.async arrivals landing at random later times. Checks: no deadlock,
#     every landing counts toward the phase it was issued for, and no TMA write lands in a stage a math warp of that
#     CTA is still reading. (With `empty` counting only the local math warps, the check fails: the peer's multicast
#     overwrites a stage being read.)
# (3) BF16 clusters (docs/grouped_gemm.md "BF16 clusters", sm90_bf16_wide_grouped_gemm_kernel<.., true>): the same
#     schedule (128-row m-tiles; n-tiles of 256, n % 256 == 0) and the protocol without the scale warp (`full` takes
#     1 arrival), A as one whole 128-row box or none (a CTA without a tile), B 32 KiB in two 16 KiB parts, 4 stages.
#   python3 scripts/gemm_cluster_model.py
import random
def units(t, nt): return t//2*nt + t%2*((nt+1)//2)
def locate(prefix, rb, re, unit, nt, bm, rank, mf):
    e = 0
    while prefix[e+1] <= unit: e += 1
    local = unit - prefix[e]
    b, en = rb[e], re[e]
    mt = (en - b + bm - 1)//bm
    pairs = mt//2
    if local < pairs*nt:
        if mf:
            n = local//pairs; p = (local - n*pairs + n) % pairs
        else:
            p = local//nt; n = local - p*nt
        return e, b + (2*p+rank)*bm, en, n, True
    n = 2*(local - pairs*nt) + rank
    if n >= nt: return e, en, en, nt-1, False
    return e, b + (mt-1)*bm, en, n, False
random.seed(1)
for trial in range(3000):
    E = random.randint(1, 12)
    counts = [random.choice([0, 1, 64, 127, 128, 129, 255, 256, 257, random.randint(0, 1200)]) for _ in range(E)]
    nt = random.randint(1, 9)
    rb, re = [], []; off = 0
    for c in counts: rb.append(off); re.append(off+c); off += c
    prefix = [0]
    for c in counts: prefix.append(prefix[-1] + units((c+127)//128, nt))
    for mf in (False, True):
        seen = {}
        for u in range(prefix[-1]):
            r0 = locate(prefix, rb, re, u, nt, 128, 0, mf)
            r1 = locate(prefix, rb, re, u, nt, 128, 1, mf)
            assert r0[4] == r1[4]
            for r in (r0, r1):
                e, m0, en, n, sh = r
                if en - m0 <= 0: continue
                assert 0 <= n < nt and rb[e] <= m0 < en and (m0 - rb[e]) % 128 == 0
                key = (e, m0, n)
                assert key not in seen, (counts, nt, key)
                seen[key] = 1
            if r0[4]: assert r0[3] == r1[3] and r1[1] == r0[1] + 128
        exp = sum(((c+127)//128)*nt for c in counts)
        assert len(seen) == exp, (counts, nt, len(seen), exp)
print("schedule: 3000 random shapes ok")
class Bar:
    def __init__(s, count): s.count = count; s.pending = count; s.tx = 0; s.phase = 0  # phase = completed phases
    def arrive(s, expect=0):
        s.tx += expect; s.pending -= 1; assert s.pending >= 0; s._check()
    def complete(s, b): s.tx -= b; s._check()
    def _check(s):
        if s.pending == 0 and s.tx == 0: s.phase += 1; s.pending = s.count
    def done(s, parity_phase):  # try_wait(parity): phase number `parity_phase` completed?
        return s.phase > parity_phase
def run(seed, bf16=False):
    R = random.Random(seed)
    S = 4 if bf16 else R.choice([4, 6]); K = R.randint(1, 7); U = R.randint(1, 6); W = 8
    A_BYTES, B_BYTES = (16384, 32768) if bf16 else (8192, 24576)
    units = []
    for u in range(U):
        shared = R.random() < 0.6
        rows = [R.choice([0, 1] if bf16 else [0, 1, 2]) for _ in range(2)]  # A chunks (BF16: the whole box) per CTA
        if shared and rows[0] == 0: rows[0] = 1  # a pair's first tile always has rows
        if bf16 and shared: rows = [1, 1]  # BF16 pairs: both m-tiles of a pair have rows (2p + 1 < t)
        units.append((shared, rows))
    full = [[Bar(1 if bf16 else 1 + 32) for _ in range(S)] for _ in range(2)]
    empty = [[Bar(2 * W) for _ in range(S)] for _ in range(2)]
    inflight = []  # (cta, stage, bytes, intended_phase)
    seq = [(u, kb) for u in range(U) for kb in range(K)]
    prod = [0, 0]; scal = [0, 0]; math = [[0] * W for _ in range(2)]
    reading = [[set() for _ in range(S)] for _ in range(2)]  # warps between full wait and release
    steps = 0
    while True:
        steps += 1
        if steps > 200000: return "livelock"
        acts = []
        for c in range(2):
            i = prod[c]
            if i < len(seq):
                s = i % S; ph = i // S
                if ph == 0 or empty[c][s].done(ph - 1): acts.append(("prod", c))
            i = scal[c]
            if not bf16 and i < len(seq):
                s = i % S; ph = i // S
                if ph == 0 or empty[c][s].done(ph - 1): acts.append(("scal", c))
            for w in range(W):
                i = math[c][w]
                if i < len(seq):
                    s = i % S; ph = i // S
                    if w in reading[c][s]: acts.append(("rel", c, w))
                    elif full[c][s].done(ph): acts.append(("read", c, w))
        if inflight: acts += [("land", j) for j in range(len(inflight))]
        if not acts:
            if all(p == len(seq) for p in prod) and all(m == len(seq) for mm in math for m in mm) and not inflight:
                return "ok"
            return "deadlock prod %s scal %s math %s" % (prod, scal, math)
        a = R.choice(acts)
        if a[0] == "prod":
            c = a[1]; i = prod[c]; s = i % S; ph = i // S; u, kb = seq[i]; shared, rows = units[u]
            full[c][s].arrive(rows[c] * A_BYTES + B_BYTES)
            if rows[c]: inflight.append((c, s, rows[c] * A_BYTES, ph))
            if shared:
                for d in range(2): inflight.append((d, s, B_BYTES // 2, ph))
            else:
                inflight.append((c, s, B_BYTES, ph))
            prod[c] += 1
        elif a[0] == "scal":
            c = a[1]; i = scal[c]; s = i % S; ph = i // S
            for _ in range(32): inflight.append((c, s, "arrive", ph))
            scal[c] += 1
        elif a[0] == "read":
            c, w = a[1], a[2]; i = math[c][w]; reading[c][i % S].add(w)
        elif a[0] == "rel":
            c, w = a[1], a[2]; i = math[c][w]; s = i % S
            reading[c][s].discard(w)
            for d in range(2): empty[d][s].arrive()
            math[c][w] += 1
        else:
            d, s, b, ph = inflight.pop(a[1])
            assert full[d][s].phase == ph, ("landed in the wrong phase", d, s, full[d][s].phase, ph)
            if b != "arrive": assert not reading[d][s], ("TMA overwrote a stage being read", d, s)
            if b == "arrive": full[d][s].arrive()
            else: full[d][s].complete(b)
for seed in range(4000):
    r = run(seed)
    assert r == "ok", (seed, r)
print("4000 random schedules ok")
for seed in range(4000):
    r = run(seed, bf16=True)
    assert r == "ok", (seed, r)
print("BF16 clusters: 4000 random schedules ok")
