"""Numba kernels of the top-level indexes (exact search)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from . import _heap


@njit(cache=True)
def topk_rows(scores, k, sign, tiebreak):
    """Best k columns of each row of scores (b, n) float32, best first, in one pass with a heap.
    ``sign`` +1 keeps the largest scores, -1 the smallest; ties go to the smaller ``tiebreak``
    (int64 (n,)). Returns (positions int64 (b, k), -1 padded; scores float32 (b, k), padded
    with the worst score: -inf for sign +1, +inf for -1)."""
    b, n = scores.shape
    kk = min(k, n)
    pos = np.full((b, k), -1, np.int64)
    out = np.full((b, k), -sign * np.inf, np.float32)  # the padding: the worst score
    if kk == 0:  # the heap below reads its root
        return pos, out
    hv = np.empty(kk, np.float32)
    ht = np.empty(kk, np.int64)
    hp = np.empty(kk, np.int64)
    for r in range(b):
        size = 0
        for j in range(n):
            v = sign * scores[r, j]
            if size < kk:  # fill, then heapify once full
                hv[size], ht[size], hp[size] = v, tiebreak[j], j
                size += 1
                if size == kk:
                    for i in range(kk // 2 - 1, -1, -1):
                        _heap.sift_down_carry(hv, ht, hp, i, kk)
            elif v >= hv[0]:  # most items fail this and cost one compare
                t = tiebreak[j]
                if v > hv[0] or t < ht[0]:
                    hv[0], ht[0], hp[0] = v, t, j
                    _heap.sift_down_carry(hv, ht, hp, 0, kk)
        if size < kk:
            for i in range(size // 2 - 1, -1, -1):
                _heap.sift_down_carry(hv, ht, hp, i, size)
        for slot in range(size - 1, -1, -1):  # pop the worst into the back
            pos[r, slot] = hp[0]
            out[r, slot] = sign * hv[0]
            size -= 1
            hv[0], ht[0], hp[0] = hv[size], ht[size], hp[size]
            _heap.sift_down_carry(hv, ht, hp, 0, size)
    return pos, out


@njit(cache=True)
def topk_ids(scores, k, sign, ids):
    """topk_rows with ``ids`` as the tie-break, returning the ids (-1 padded) in place of the
    positions."""
    pos, out = topk_rows(scores, k, sign, ids)
    res = np.full(pos.shape, -1, np.int64)
    for r in range(pos.shape[0]):
        for j in range(pos.shape[1]):
            if pos[r, j] >= 0:
                res[r, j] = ids[pos[r, j]]
    return res, out


@njit(cache=True)
def heap_push_block(scores, ids, rows, heap_s, heap_i, sizes):
    """Fold a block of scores (a, b) of items ``ids`` (b,) into the top-k heaps of queries
    ``rows`` (a,): heap_s/heap_i (nq, k) worst-at-root, ties to the smaller id; sizes (nq,)."""
    k = heap_s.shape[1]
    for r in range(scores.shape[0]):
        q = rows[r]
        hv = heap_s[q]
        ht = heap_i[q]
        size = sizes[q]
        for j in range(scores.shape[1]):
            v = scores[r, j]
            if size < k or v >= hv[0]:  # most items fail this and cost one compare
                size = _heap.push(hv, ht, size, v, ids[j])
        sizes[q] = size


@njit(cache=True)
def heap_finish(heap_s, heap_i, sizes):
    """Turn the heaps into best-first rows, padded with -1 / -inf (in place)."""
    for q in range(heap_s.shape[0]):
        hv = heap_s[q]
        ht = heap_i[q]
        _heap.sort_best_first(hv, ht, sizes[q])
        for slot in range(sizes[q], heap_s.shape[1]):
            hv[slot], ht[slot] = -np.inf, -1


@njit(cache=True)
def merge_topk(cand_ids, cand_scores, k, higher_is_better):
    """The one top-k merge: per row, the k best of (nq, L) candidate ids (int64, -1 padding)
    and scores (float32), each id at most once (a Pyramid item may sit in several parts), ties
    to the smaller id as everywhere else. Returns ids int64 (nq, k) and scores float32 (nq, k),
    best first, -1 / the metric's padding where fewer than k."""
    nq, width = cand_ids.shape
    out_ids = np.full((nq, k), -1, np.int64)
    pad = -np.inf if higher_is_better else np.inf
    out_scores = np.full((nq, k), pad, np.float32)
    key = np.empty(width, np.float64)
    for i in range(nq):
        by_id = np.argsort(cand_ids[i], kind="mergesort")  # then stably by score: ties by id
        for t in range(width):
            j = by_id[t]
            if cand_ids[i, j] < 0:
                key[t] = np.inf
            else:
                key[t] = -cand_scores[i, j] if higher_is_better else cand_scores[i, j]
        order = by_id[np.argsort(key, kind="mergesort")]
        filled = 0
        for t in range(width):
            j = order[t]
            cid = cand_ids[i, j]
            if cid < 0:
                break
            if filled and out_ids[i, filled - 1] == cid:  # a copy: equal ids sort together
                continue
            seen = False
            for u in range(filled):
                if out_ids[i, u] == cid:
                    seen = True
                    break
            if seen:
                continue
            out_ids[i, filled] = cid
            out_scores[i, filled] = cand_scores[i, j]
            filled += 1
            if filled == k:
                break
    return out_ids, out_scores


@njit(cache=True, fastmath=True)
def dot(a, b):
    """a·b of two float32 vectors in any order of additions (fastmath lets the loop run in SIMD
    lanes). Not ``inline="always"``: numba's own inlining compiles the loop with the caller's
    flags, without fastmath, and a re-rank ran 3x slower so (bench/kernels_bench.py); LLVM
    inlines it anyway, keeping the flags."""
    s = np.float32(0.0)
    for j in range(a.shape[0]):
        s += a[j] * b[j]
    return s


@njit(cache=True, inline="always")
def _norm_lists_row(r, q, qn, x, norms, ids, offsets, probes, k, allowed, hs, hi, sizes, scored):
    """Query r of :func:`scan_norm_lists` into its heap (hs[r], hi[r]), with the heap's size
    and the items it scored. ``allowed`` uint8 per position (empty: every
    item): the others are skipped, which can only make a list's stop later, never wrong."""
    hv, ht = hs[r], hi[r]
    qr, masked = q[r], allowed.shape[0] > 0
    # a hair above |q|: the computed q·x of an item parallel to q may round above |q||x|
    bound = qn[r] * np.float32(1.0 + 2.0**-16)
    size, n_read = 0, 0
    for p in range(probes.shape[1]):
        lst = probes[r, p]
        for i in range(offsets[lst], offsets[lst + 1]):
            if size == k and bound * norms[i] < hv[0]:
                break
            if masked and not allowed[i]:
                continue
            v = dot(qr, x[i])
            n_read += 1
            # the guard before the call, not only inside it: without it this loop ran 2.9x
            # slower (bench/heap_bench.py), though push makes the same test
            if size < k or v >= hv[0]:
                size = _heap.push(hv, ht, size, v, ids[i])
    sizes[r], scored[r] = size, n_read


@njit(cache=True, inline="always")
def _norm_lists_out(nq, k):
    """(heap scores, heap ids, heap sizes, items scored) for nq queries, the heaps empty."""
    return (np.full((nq, k), -np.inf, np.float32), np.full((nq, k), -1, np.int64),
            np.zeros(nq, np.int64), np.zeros(nq, np.int64))


@njit(cache=True, inline="always")
def _norm_lists_result(hs, hi, sizes, scored):
    """(ids, scores, items scored) of filled heaps, each row best first."""
    heap_finish(hs, hi, sizes)
    return hi, hs, scored


@njit(cache=True)
def scan_norm_lists(q, qn, x, norms, ids, offsets, probes, k, allowed):
    """Top-k inner products of each query row among the items of its lists ``probes`` (nq, P),
    visited in that order. Items are stored grouped by list (list l at positions
    [offsets[l], offsets[l + 1])), by decreasing norm within a list, so a list is left as soon
    as |q| (``qn``) times the next item's norm is below the k-th best: Cauchy–Schwarz says no
    item after it can do better. Ties go to the smaller id. Returns (ids int64 (nq, k), scores
    float32 (nq, k), best first, -1 / -inf padded; items scored per query int64 (nq,)).
    ``allowed``: uint8 per position, the items a filtered search may return (empty: all)."""
    hs, hi, sizes, scored = _norm_lists_out(q.shape[0], k)
    for r in range(q.shape[0]):
        _norm_lists_row(r, q, qn, x, norms, ids, offsets, probes, k, allowed, hs, hi, sizes,
                        scored)
    return _norm_lists_result(hs, hi, sizes, scored)


@njit(cache=True, parallel=True)
def scan_norm_lists_parallel(q, qn, x, norms, ids, offsets, probes, k, allowed):
    """As :func:`scan_norm_lists`, queries spread over numba threads."""
    hs, hi, sizes, scored = _norm_lists_out(q.shape[0], k)
    for r in prange(q.shape[0]):
        _norm_lists_row(r, q, qn, x, norms, ids, offsets, probes, k, allowed, hs, hi, sizes,
                        scored)
    return _norm_lists_result(hs, hi, sizes, scored)


@njit(cache=True)
def bfs_order(links, degree, start):
    """Positions in breadth-first order of the graph from ``start`` (then from each node not
    reached yet, in position order): ``order[new] = old``. Neighbours laid out near each other
    share cache lines and pages during a walk (Coleman et al., "Graph Reordering for
    Cache-Efficient Near Neighbor Search", 2022: BFS and RCM about as good as Gorder)."""
    n = links.shape[0]
    order = np.empty(n, np.int32)
    seen = np.zeros(n, np.bool_)
    head = tail = 0
    for s in range(-1, n):
        root = start if s < 0 else s
        if root < 0 or root >= n or seen[root]:
            continue
        seen[root] = True
        order[tail] = root
        tail += 1
        while head < tail:
            u = order[head]
            head += 1
            for j in range(degree[u]):
                v = links[u, j]
                if v >= 0 and not seen[v]:
                    seen[v] = True
                    order[tail] = v
                    tail += 1
    return order
