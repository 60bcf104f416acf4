"""Numba kernels of Simple-LSH / Norm-Ranging LSH: sign-random-projection hashing, bucket
enumeration in (range, Hamming distance) score order, probing with exact inner-product re-rank.

Layout the kernels share (built by :mod:`simsearch.lsh.nr_lsh`):
  xs (n, d) float32, ids (n,) int64          items in bucket order
  bcode (B,) uint64                          bucket codes, sorted by (range, code)
  bstart (B + 1,) int64                      items of bucket b are xs[bstart[b]:bstart[b + 1]]
  rbstart (m + 1,) int64                     buckets of range r are rbstart[r]:rbstart[r + 1]
  projT (L, d + 1) float32                   one row per hash bit
  seq (P,) int64                             pairs r * (L + 1) + h (range, Hamming distance)
                                             in probe order
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .._numba_util import prefetch as _prefetch

PREFETCH_AHEAD = 16  # buckets; an item row is requested this many buckets before it is scored


@njit(cache=True, inline="always")
def popcount64(v):
    """Set bits of a uint64 (SWAR; unsigned constants so nothing turns into float)."""
    v = v - ((v >> np.uint64(1)) & np.uint64(0x5555555555555555))
    v = (v & np.uint64(0x3333333333333333)) + ((v >> np.uint64(2)) & np.uint64(0x3333333333333333))
    v = (v + (v >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((v * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(cache=True, parallel=True)
def hash_items(x, scale, tail, projT):
    """Codes uint64 (n,) of the transformed items [scale_i * x_i, tail_i]: bit b is set when
    projT[b] . [scale_i x_i, tail_i] >= 0. x float32 (n, d); scale, tail float64 (n,)."""
    n, d = x.shape
    L = projT.shape[0]
    out = np.zeros(n, np.uint64)
    for i in prange(n):
        c = np.uint64(0)
        for b in range(L):
            s = 0.0
            for j in range(d):
                s += np.float64(x[i, j]) * np.float64(projT[b, j])
            s = s * scale[i] + tail[i] * np.float64(projT[b, d])
            if s >= 0.0:
                c |= np.uint64(1) << np.uint64(b)
        out[i] = c
    return out


@njit(cache=True)
def hash_query(q, projT):
    """Code uint64 of a query transformed to [q / |q|, 0] (the norm does not change signs)."""
    d = q.shape[0]
    L = projT.shape[0]
    c = np.uint64(0)
    for b in range(L):
        s = 0.0
        for j in range(d):
            s += np.float64(q[j]) * np.float64(projT[b, j])
        if s >= 0.0:
            c |= np.uint64(1) << np.uint64(b)
    return c


@njit(cache=True, inline="always")
def _worse(s1, i1, s2, i2):
    """(s1, i1) ranks below (s2, i2): lower score, or equal score and larger id."""
    return s1 < s2 or (s1 == s2 and i1 > i2)


@njit(cache=True)
def _heap_push(hs, hi, cnt, s, i):
    """Keep the best len(hs) (score, id) pairs in a min-heap whose root is the worst; returns
    the new count."""
    k = hs.shape[0]
    if cnt < k:
        pos = cnt
        cnt += 1
        while pos > 0:
            par = (pos - 1) >> 1
            if _worse(s, i, hs[par], hi[par]):
                hs[pos] = hs[par]
                hi[pos] = hi[par]
                pos = par
            else:
                break
        hs[pos] = s
        hi[pos] = i
        return cnt
    if not _worse(hs[0], hi[0], s, i):
        return cnt
    pos = 0
    while True:
        c = 2 * pos + 1
        if c >= k:
            break
        if c + 1 < k and _worse(hs[c + 1], hi[c + 1], hs[c], hi[c]):
            c += 1
        if _worse(hs[c], hi[c], s, i):
            hs[pos] = hs[c]
            hi[pos] = hi[c]
            pos = c
        else:
            break
    hs[pos] = s
    hi[pos] = i
    return cnt


@njit(cache=True, fastmath=True)
def search_one(
    q, projT, xs, ids, bcode, bstart, rbstart, seq, n_probe, out_i, out_s, order, hstart, cursor,
    touched, trace,
):  # fmt: skip
    """Probe buckets of (range, Hamming distance) pairs (pair index r * (L + 1) + h) in the order
    seq until at least n_probe items are probed; keep the top len(out_i) by exact inner product,
    best first (ties by smaller id) in out_i int64 / out_s float32, padded with -1 / -inf.

    A range's buckets are counting-sorted by Hamming distance to the query code the first time
    the range is reached (order, hstart[r]: per-query buffers), so ranges never reached cost
    nothing and no comparison sort over buckets happens. When trace has room, probed bucket
    indexes are written to it in probe order (-1 after the last). Returns (items, buckets)
    probed."""
    d = q.shape[0]
    L = projT.shape[0]
    H = L + 1
    k = out_i.shape[0]
    qc = hash_query(q, projT)
    touched[:] = False
    for t in range(trace.shape[0]):
        trace[t] = -1
    cnt = 0
    probed = 0
    nb = 0
    for pos in range(seq.shape[0]):
        p = seq[pos]
        r = p // H
        h = p - r * H
        b0 = rbstart[r]
        b1 = rbstart[r + 1]
        if b0 == b1:
            continue
        if not touched[r]:
            touched[r] = True
            for t in range(L + 2):
                hstart[r, t] = 0
            for b in range(b0, b1):
                hstart[r, popcount64(bcode[b] ^ qc) + 1] += 1
            for t in range(L + 1):
                hstart[r, t + 1] += hstart[r, t]
            for t in range(L + 1):
                cursor[t] = hstart[r, t]
            for b in range(b0, b1):  # stable: equal distances keep code order
                dist = popcount64(bcode[b] ^ qc)
                order[b0 + cursor[dist]] = b
                cursor[dist] += 1
        t1 = hstart[r, h + 1]
        for t in range(hstart[r, h], t1):
            # two-stage prefetch: the bucket bounds 2D ahead, the rows D ahead (whose bounds
            # arrived meanwhile)
            if t + 2 * PREFETCH_AHEAD < t1:
                _prefetch(bstart, order[b0 + t + 2 * PREFETCH_AHEAD], 0)
            if t + PREFETCH_AHEAD < t1:
                bb = order[b0 + t + PREFETCH_AHEAD]
                for it in range(bstart[bb], min(bstart[bb + 1], bstart[bb] + 2)):
                    for c in range(0, d, 16):
                        _prefetch(xs, it, c)
            b = order[b0 + t]
            if nb < trace.shape[0]:
                trace[nb] = b
            nb += 1
            for it in range(bstart[b], bstart[b + 1]):
                s = np.float32(0.0)
                for j in range(d):
                    s += q[j] * xs[it, j]
                if cnt < k or s >= out_s[0]:  # most items lose to the heap's root: no call
                    cnt = _heap_push(out_s, out_i, cnt, s, ids[it])
            probed += bstart[b + 1] - bstart[b]
            if probed >= n_probe:
                break
        if probed >= n_probe:
            break
    # heap -> best first, ties by smaller id (stable sorts: by id, then by score)
    hs = out_s[:cnt].copy()
    hi = out_i[:cnt].copy()
    o1 = np.argsort(hi, kind="mergesort")
    hs = hs[o1]
    hi = hi[o1]
    o2 = np.argsort(-hs, kind="mergesort")
    for t in range(k):
        if t < cnt:
            out_i[t] = hi[o2[t]]
            out_s[t] = hs[o2[t]]
        else:
            out_i[t] = -1
            out_s[t] = -np.inf
    return probed, nb


@njit(cache=True)
def search_batch(Q, projT, xs, ids, bcode, bstart, rbstart, seq, n_probe, k):
    """search_one over the rows of Q, one thread. Returns ids int64 (nq, k), scores float32
    (nq, k), probed items int64 (nq,), probed buckets int64 (nq,)."""
    nq = Q.shape[0]
    out_i = np.empty((nq, k), np.int64)
    out_s = np.empty((nq, k), np.float32)
    probed = np.empty(nq, np.int64)
    nbs = np.empty(nq, np.int64)
    order = np.empty(bcode.shape[0], np.int32)
    hstart = np.empty((rbstart.shape[0] - 1, projT.shape[0] + 2), np.int64)
    cursor = np.empty(projT.shape[0] + 1, np.int64)
    touched = np.empty(rbstart.shape[0] - 1, np.bool_)
    trace = np.empty(0, np.int64)
    for i in range(nq):
        probed[i], nbs[i] = search_one(
            Q[i], projT, xs, ids, bcode, bstart, rbstart, seq, n_probe, out_i[i], out_s[i],
            order, hstart, cursor, touched, trace,
        )  # fmt: skip
    return out_i, out_s, probed, nbs


@njit(cache=True, parallel=True)
def search_batch_parallel(Q, projT, xs, ids, bcode, bstart, rbstart, seq, n_probe, k):
    """search_batch with queries spread over numba's threads (per-query buffers)."""
    nq = Q.shape[0]
    out_i = np.empty((nq, k), np.int64)
    out_s = np.empty((nq, k), np.float32)
    probed = np.empty(nq, np.int64)
    nbs = np.empty(nq, np.int64)
    for i in prange(nq):
        order = np.empty(bcode.shape[0], np.int32)
        hstart = np.empty((rbstart.shape[0] - 1, projT.shape[0] + 2), np.int64)
        cursor = np.empty(projT.shape[0] + 1, np.int64)
        touched = np.empty(rbstart.shape[0] - 1, np.bool_)
        trace = np.empty(0, np.int64)
        probed[i], nbs[i] = search_one(
            Q[i], projT, xs, ids, bcode, bstart, rbstart, seq, n_probe, out_i[i], out_s[i],
            order, hstart, cursor, touched, trace,
        )  # fmt: skip
    return out_i, out_s, probed, nbs


@njit(cache=True)
def probe_trace(q, projT, xs, ids, bcode, bstart, rbstart, seq, n_probe, k):
    """The bucket indexes search_one probes for one query, in order (for tests and plots)."""
    B = bcode.shape[0]
    m = rbstart.shape[0] - 1
    L = projT.shape[0]
    trace = np.empty(B, np.int64)
    _, nb = search_one(
        q, projT, xs, ids, bcode, bstart, rbstart, seq, n_probe, np.empty(k, np.int64),
        np.empty(k, np.float32), np.empty(B, np.int32), np.empty((m, L + 2), np.int64),
        np.empty(L + 1, np.int64), np.empty(m, np.bool_), trace,
    )  # fmt: skip
    return trace[: min(nb, B)]
