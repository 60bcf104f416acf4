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
  seq_umax (P,) float64                      largest U_j over the pairs seq[pos:]
  U (m,) float64                             the ranges' U_j (>= every norm in the range)
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import _heap
from .._numba_util import prefetch as _prefetch

PREFETCH_AHEAD = 16  # buckets; an item row is requested this many buckets before it is scored


@intrinsic
def ctpop64(typingctx, v):
    """Set bits of a uint64 through LLVM's ctpop: one popcnt instruction where the CPU has it,
    and a loop of them vectorizes (the SWAR formula did not)."""
    if not (isinstance(v, types.Integer) and v.bitwidth == 64):
        return None

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i64]), "llvm.ctpop.i64"
        )
        return builder.call(fn, [args[0]])

    return types.int64(v), codegen


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
def _distances(codes, qc, out):
    """out[i] = popcount(codes[i] ^ qc). On contiguous views with a plain loop LLVM vectorizes
    it (~0.1 ns a bucket; ~1.2 ns when indexed by offsets into the whole array)."""
    for i in range(codes.shape[0]):
        out[i] = ctpop64(codes[i] ^ qc)


@njit(cache=True, inline="always")
def _extend_range(qc, bcode, b0, b1, h, L, order, dist, sel, hstart_r, hdone, r):
    """Make order[b0 + hstart_r[t] : b0 + hstart_r[t + 1]] the buckets of range r (b0:b1) at
    Hamming distance t from qc, in code order, for every t <= h
    (at least; hdone[r] is how far it is done, -1 before the range is first reached).

    A walk needs few distances of most ranges it reaches (below the top few, rarely past h ~ 10
    of 27 bits, where a few percent of a range's buckets lie), so rather than counting-sorting a
    whole range the first time, this selects the buckets with distance in the next 0.4 L
    values (a branchless compaction into sel) and counting-sorts only those; a later pair past
    them extends by another step. The distances are computed once per range (vectorized on
    contiguous views). (Copying the buckets' item spans into the order instead of their indexes
    measured 6-15 % slower for multi-item buckets: Simple-LSH, 1M synthetic at 64 bits.)"""
    if hdone[r] < 0:
        _distances(bcode[b0:b1], qc, dist[b0:b1])
        hstart_r[0] = 0
    lo = hdone[r] + 1
    # a step of 0.4 L distances: 11 of 27 hash bits covers what most ranges need in one pass
    # (measured best among 5-14 there); at 59 bits a fixed 11 took three passes (slower)
    hi = min(max(h, lo + max(4, (2 * L + 2) // 5) - 1), L)
    dd = dist[b0:b1]
    n = b1 - b0
    width = hi - lo
    ns = 0
    for i in range(n):  # no branch: the selected share is unpredictable
        sel[ns] = i
        ns += np.int64(np.uint8(dd[i] - lo) <= width)
    cnt = np.zeros(L + 2, np.int64)
    for j in range(ns):
        cnt[dd[sel[j]]] += 1
    acc = hstart_r[lo]
    for t in range(lo, hi + 1):
        c = cnt[t]
        cnt[t] = acc
        acc += c
        hstart_r[t + 1] = acc
    for j in range(ns):
        i = sel[j]
        t = dd[i]
        order[b0 + cnt[t]] = b0 + i
        cnt[t] += 1
    hdone[r] = hi


@njit(cache=True, fastmath=True)
def search_one(
    q, projT, xs, ids, bcode, bstart, rbstart, seq, seq_umax, U, prune, n_probe, out_i, out_s,
    order, dist, sel, hstart, hdone, trace,
):  # fmt: skip
    """Probe buckets of (range, Hamming distance) pairs (pair index r * (L + 1) + h) in the order
    seq until at least n_probe items are probed; keep the top len(out_i) by exact inner product,
    best first (ties by smaller id) in out_i int64 / out_s float32, padded with -1 / -inf.

    A range's buckets are ordered by Hamming distance to the query code lazily, as far as the
    walk needs (_extend_range; order, dist, sel, hstart[r], hdone: per-query buffers), so ranges
    never reached cost nothing and no comparison sort over buckets happens.

    prune: an item of range r scores at most U[r] |q| (Cauchy-Schwarz, U[r] >= every norm in
    r). Once k items are held, a pair whose range bound is below the k-th best score is skipped
    (its range is not even ordered), and the walk stops when seq_umax[pos] (the largest U over
    the pairs from pos on) is: no skipped item could enter the top k, so the answer is never
    worse than without pruning at the same budget, and the budget goes to buckets that can
    still contribute. When trace has room, the probed bucket indexes are written to it in
    probe order (-1 after the last). Returns (items, buckets) probed."""
    d = q.shape[0]
    L = projT.shape[0]
    H = L + 1
    k = out_i.shape[0]
    qc = hash_query(q, projT)
    qn = 0.0
    for j in range(d):
        qn += np.float64(q[j]) * np.float64(q[j])
    # float32 inner products carry a relative rounding error far below 1e-4 of |q| |x|
    qn = np.sqrt(qn) * (1.0 + 1e-4)
    hdone[:] = -1
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
        if prune and cnt == k:
            if seq_umax[pos] * qn < out_s[0]:
                break
            if U[r] * qn < out_s[0]:
                continue
        if h > hdone[r]:
            _extend_range(qc, bcode, b0, b1, h, L, order, dist, sel, hstart[r], hdone, r)
        t1 = b0 + hstart[r, h + 1]
        for t in range(b0 + hstart[r, h], t1):
            # two-stage prefetch: the bucket bounds 2D ahead, the rows D ahead (whose bounds
            # arrived meanwhile)
            if t + 2 * PREFETCH_AHEAD < t1:
                _prefetch(bstart, order[t + 2 * PREFETCH_AHEAD], 0)
            if t + PREFETCH_AHEAD < t1:
                bb = order[t + PREFETCH_AHEAD]
                a0 = bstart[bb]
                for it in range(a0, min(bstart[bb + 1], a0 + 2)):
                    for c in range(0, d, 16):
                        _prefetch(xs, it, c)
            b = order[t]
            i0 = bstart[b]
            i1 = bstart[b + 1]
            if nb < trace.shape[0]:
                trace[nb] = b
            nb += 1
            for it in range(i0, i1):
                s = np.float32(0.0)
                for j in range(d):
                    s += q[j] * xs[it, j]
                if cnt < k or s >= out_s[0]:  # most items lose to the heap's root: no call
                    cnt = _heap.push(out_s, out_i, cnt, s, ids[it])
            probed += i1 - i0
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
def _buffers(B, m, L):
    """Per-query work buffers of search_one: order, dist, sel, hstart, hdone."""
    return (np.empty(B, np.int32), np.empty(B, np.uint8), np.empty(B, np.int32),
            np.empty((m, L + 2), np.int64), np.empty(m, np.int64))  # fmt: skip


@njit(cache=True)
def search_batch(Q, projT, xs, ids, bcode, bstart, rbstart, seq, seq_umax, U, prune, n_probe,
                 k):  # fmt: skip
    """search_one over the rows of Q, one thread. Returns ids int64 (nq, k), scores float32
    (nq, k), probed items int64 (nq,), probed buckets int64 (nq,)."""
    nq = Q.shape[0]
    out_i = np.empty((nq, k), np.int64)
    out_s = np.empty((nq, k), np.float32)
    probed = np.empty(nq, np.int64)
    nbs = np.empty(nq, np.int64)
    order, dist, sel, hstart, hdone = _buffers(bcode.shape[0], rbstart.shape[0] - 1,
                                                 projT.shape[0])  # fmt: skip
    trace = np.empty(0, np.int64)
    for i in range(nq):
        probed[i], nbs[i] = search_one(
            Q[i], projT, xs, ids, bcode, bstart, rbstart, seq, seq_umax, U, prune, n_probe,
            out_i[i], out_s[i], order, dist, sel, hstart, hdone, trace,
        )  # fmt: skip
    return out_i, out_s, probed, nbs


@njit(cache=True, parallel=True)
def search_batch_parallel(Q, projT, xs, ids, bcode, bstart, rbstart, seq, seq_umax, U, prune,
                          n_probe, k, n_chunks):  # fmt: skip
    """search_batch with the queries cut into n_chunks contiguous chunks (one per thread) spread
    over numba's threads, each chunk with its own work buffers (they are O(buckets): allocated
    per chunk, not per query)."""
    nq = Q.shape[0]
    out_i = np.empty((nq, k), np.int64)
    out_s = np.empty((nq, k), np.float32)
    probed = np.empty(nq, np.int64)
    nbs = np.empty(nq, np.int64)
    nc = max(1, min(n_chunks, nq))
    for c in prange(nc):
        order, dist, sel, hstart, hdone = _buffers(bcode.shape[0], rbstart.shape[0] - 1,
                                                  projT.shape[0])  # fmt: skip
        trace = np.empty(0, np.int64)
        for i in range(c * nq // nc, (c + 1) * nq // nc):
            probed[i], nbs[i] = search_one(
                Q[i], projT, xs, ids, bcode, bstart, rbstart, seq, seq_umax, U, prune, n_probe,
                out_i[i], out_s[i], order, dist, sel, hstart, hdone, trace,
            )  # fmt: skip
    return out_i, out_s, probed, nbs


@njit(cache=True)
def probe_trace(q, projT, xs, ids, bcode, bstart, rbstart, seq, seq_umax, U, prune, n_probe, k):
    """The bucket indexes search_one probes for one query, in order (for tests and plots)."""
    B = bcode.shape[0]
    order, dist, sel, hstart, hdone = _buffers(B, rbstart.shape[0] - 1, projT.shape[0])
    trace = np.empty(B, np.int64)
    _, nb = search_one(
        q, projT, xs, ids, bcode, bstart, rbstart, seq, seq_umax, U, prune, n_probe,
        np.empty(k, np.int64), np.empty(k, np.float32), order, dist, sel, hstart, hdone, trace,
    )  # fmt: skip
    return trace[: min(nb, B)]
