"""numba kernels of the sparse indexes: the exact inverted-index scan (term-at-a-time
accumulation over posting lists, then a bounded heap; inner products, or BM25 weighed at query
time), the dot product of two sorted sparse rows, and Seismic's build (its walk is compiled: csrc/,
``seismic_search``)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .. import _heap

#: ``inverted_scan``'s and ``sorted_dot``'s arguments for plain inner products
NO_LENGTHS = np.empty(0, np.float32)
NO_BM25 = (np.float32(1.0), np.float32(0.0), np.float32(1.0))


@njit(cache=True, inline="always")
def weight(v, d, dl, bm25):
    """Item ``d``'s weight for a term it holds with value ``v``: the value itself, or with
    lengths ``dl`` (BM25) Lucene's term-frequency component of the count ``v`` with
    ``bm25 = (k1, b, avgdl)``. In float32: every path that scores an item rounds alike, or a
    tie breaks differently by the path."""
    if dl.size == 0:
        return v
    k1, b, avgdl = bm25
    return np.float32(v / (v + k1 * (np.float32(1.0) - b + b * dl[d] / avgdl)))


@njit(cache=True, inline="always")
def sorted_dot(ai, av, bi, bv, d, dl, bm25):
    """(score, shares a term) of query row (ai, av) against item ``d``'s row (bi, bv), both with
    strictly increasing term ids; the item's values weighed by ``weight``."""
    s = np.float32(0.0)
    hit = False
    x, y = 0, 0
    while x < ai.size and y < bi.size:
        if ai[x] == bi[y]:
            s += np.float32(av[x] * weight(bv[y], d, dl, bm25))
            hit = True
            x += 1
            y += 1
        elif ai[x] < bi[y]:
            x += 1
        else:
            y += 1
    return s, hit


@njit(cache=True)
def inverted_scan(qp, qi, qv, post_ptr, post_pos, post_val, n_main, fp, fi, fv, pos_ids,
                  ok, k, dl, bm25):
    """Exact top-k of each query row among the positions ``ok`` allows: positions below
    ``n_main`` through their posting lists (``post_*``: CSC over positions), the rest (the
    tail not yet in the lists) by ``sorted_dot`` against their forward rows (``f*``, CSR by
    position). Candidates are the items sharing a term with the query. ``dl`` empty: scores
    are inner products; else BM25, the postings holding counts weighed at query time by the
    item lengths ``dl`` and ``bm25 = (k1, b, avgdl)``, the query's values carrying the idf.
    Returns (ids, scores), -1 / -inf padded."""
    nq = qp.size - 1
    out_i = np.full((nq, k), -1, np.int64)
    out_s = np.full((nq, k), -np.inf, np.float32)
    acc = np.zeros(n_main, np.float32)
    seen = np.zeros(n_main, np.bool_)
    touched = np.empty(n_main, np.int64)
    hs = np.empty(k, np.float32)
    hi = np.empty(k, np.int64)
    for q in range(nq):
        a, b = qp[q], qp[q + 1]
        nt = 0
        for j in range(a, b):
            t = qi[j]
            w = qv[j]
            for e in range(post_ptr[t], post_ptr[t + 1]):
                d = post_pos[e]
                if not seen[d]:
                    seen[d] = True
                    touched[nt] = d
                    nt += 1
                acc[d] += np.float32(w * weight(post_val[e], d, dl, bm25))
        size = 0
        for c in range(nt):
            d = touched[c]
            if ok[d]:
                size = _heap.push(hs, hi, size, acc[d], pos_ids[d])
            acc[d] = 0.0
            seen[d] = False
        size = push_tail(hs, hi, size, qi[a:b], qv[a:b], n_main, fp, fi, fv, pos_ids, ok, dl,
                         bm25)
        write_best(hs, hi, size, out_i, out_s, q)
    return out_i, out_s


@njit(cache=True, inline="always")
def push_tail(hs, hi, size, qi, qv, n_main, fp, fi, fv, pos_ids, ok, dl, bm25):
    """Score the tail (positions from ``n_main`` on: added since the lists were built) row by
    row against the query's sorted terms ``qi`` / ``qv`` into the heap; returns its size."""
    for d in range(n_main, pos_ids.size):
        if ok[d]:
            s, hit = sorted_dot(qi, qv, fi[fp[d]:fp[d + 1]], fv[fp[d]:fp[d + 1]], d, dl, bm25)
            if hit:
                size = _heap.push(hs, hi, size, s, pos_ids[d])
    return size


@njit(cache=True, inline="always")
def write_best(hs, hi, size, out_i, out_s, q):
    """Query ``q``'s row of the answers: the heap's items, best first."""
    _heap.sort_best_first(hs, hi, size)
    for c in range(size):
        out_i[q, c] = hi[c]
        out_s[q, c] = hs[c]


# -- Seismic (Bruch, Nardini, Rulli, Venturini, SIGIR 2024) ------------------------------------


@njit(cache=True)
def row_dot_dense(qd, fi, fv, a, b):
    """Forward row ``fi[a:b], fv[a:b]`` against the dense vector ``qd``."""
    s = np.float32(0.0)
    for e in range(a, b):
        s += qd[fi[e]] * fv[e]
    return s


@njit(cache=True)
def cluster_block_members(docs, fp, fi, fv, n_blocks, seed, scratch):
    """Split one posting list's documents ``docs`` (positions) into at most ``n_blocks`` blocks:
    ``n_blocks`` of them drawn as centroids, every document in the block of the centroid it has
    the largest inner product with (the paper's geometric blocking). Returns (order, starts):
    the documents grouped by block and each block's start, empty blocks dropped. ``scratch`` is
    a zeroed dense float32 vector of the vocabulary's size, left zeroed."""
    m = docs.size
    c = min(n_blocks, m)
    np.random.seed(seed)
    cent = np.random.choice(m, c, replace=False)
    assign = np.empty(m, np.int64)
    best = np.full(m, -np.inf, np.float32)
    for j in range(c):
        d = docs[cent[j]]
        for e in range(fp[d], fp[d + 1]):
            scratch[fi[e]] = fv[e]
        for i in range(m):
            x = docs[i]
            s = row_dot_dense(scratch, fi, fv, fp[x], fp[x + 1])
            if s > best[i]:
                best[i] = s
                assign[i] = j
        for e in range(fp[d], fp[d + 1]):
            scratch[fi[e]] = 0.0
    counts = np.zeros(c + 1, np.int64)
    for i in range(m):
        counts[assign[i] + 1] += 1
    starts = np.cumsum(counts)
    fill = starts[:-1].copy()
    order = np.empty(m, np.int64)
    for i in range(m):
        order[fill[assign[i]]] = docs[i]
        fill[assign[i]] += 1
    keep = np.flatnonzero(counts[1:] > 0)
    out = np.empty(keep.size + 1, np.int64)
    for j in range(keep.size):
        out[j] = starts[keep[j]]
    out[keep.size] = m
    return order, out


@njit(cache=True)
def block_summary(block, fp, fi, fv, alpha, scratch, mark, terms):
    """A block's summary: the coordinate-wise maximum of its documents, its largest entries
    kept until they hold ``alpha`` of its mass, sorted by term id; quantized to 8 bits with one
    scale. Returns (terms uint32, codes uint8, scale)."""
    nt = 0
    for d in block:
        for e in range(fp[d], fp[d + 1]):
            t = fi[e]
            if not mark[t]:
                mark[t] = True
                terms[nt] = t
                nt += 1
            if fv[e] > scratch[t]:
                scratch[t] = fv[e]
    vals = np.empty(nt, np.float32)
    total = 0.0
    for j in range(nt):
        vals[j] = scratch[terms[j]]
        total += vals[j]
    order = np.argsort(-vals)
    kept, mass = 0, 0.0
    while kept < nt and (kept == 0 or mass < alpha * total):
        mass += vals[order[kept]]
        kept += 1
    sel = np.sort(terms[order[:kept]])
    top = vals[order[0]] if nt else np.float32(0.0)
    scale = np.float32(top / 255.0) if top > 0 else np.float32(1.0)
    codes = np.empty(kept, np.uint8)
    for j in range(kept):
        # rounded up: a summary bounds its block's scores from above
        codes[j] = min(255, int(np.ceil(scratch[sel[j]] / scale)))
    for j in range(nt):
        scratch[terms[j]] = 0.0
        mark[terms[j]] = False
    return sel.astype(np.uint32), codes, scale


@njit(cache=True)
def by_term(sstart, st, sc):
    """One list's summaries (block-major: block j's terms ``st`` and codes ``sc`` at
    ``sstart[j]:sstart[j + 1]``) turned term-major, as the walk reads them: (the distinct terms
    ascending, each one's entries' start (local), each entry's block (local, uint16), its
    code)."""
    blk = np.empty(st.size, np.uint16)
    for j in range(sstart.size - 1):
        blk[sstart[j]:sstart[j + 1]] = j
    order = np.argsort(st, kind="mergesort")
    ts = st[order]
    n_u = 0
    for i in range(ts.size):
        if i == 0 or ts[i] != ts[i - 1]:
            n_u += 1
    comps = np.empty(n_u, np.uint32)
    cptr = np.empty(n_u + 1, np.int64)
    u = 0
    for i in range(ts.size):
        if i == 0 or ts[i] != ts[i - 1]:
            comps[u] = ts[i]
            cptr[u] = i
            u += 1
    cptr[n_u] = ts.size
    return comps, cptr, blk[order], sc[order]


@njit(cache=True)
def term_blocks(docs, vals, lam, n_blocks, fp, fi, fv, alpha, seed, scratch, mark, terms):
    """One term's blocks: its posting list (``docs`` with their ``vals`` for the term) pruned to
    the ``lam`` largest values, clustered into at most ``n_blocks`` blocks, each summarised.
    Returns (documents by block, block starts, the summaries term-major (``by_term``): terms,
    their entries' starts, entries' blocks, codes; each block's scale)."""
    if docs.size > lam:
        top = np.argsort(-vals)[:lam]
        docs = docs[top]
    order, starts = cluster_block_members(docs, fp, fi, fv, n_blocks, seed, scratch)
    nb = starts.size - 1
    sstart = np.zeros(nb + 1, np.int64)
    parts_t = []
    parts_c = []
    scales = np.empty(nb, np.float32)
    for j in range(nb):
        t, c, sc = block_summary(order[starts[j]:starts[j + 1]], fp, fi, fv, alpha, scratch,
                                 mark, terms)
        parts_t.append(t)
        parts_c.append(c)
        scales[j] = sc
        sstart[j + 1] = sstart[j] + t.size
    st = np.empty(sstart[nb], np.uint32)
    sc_ = np.empty(sstart[nb], np.uint8)
    for j in range(nb):
        st[sstart[j]:sstart[j + 1]] = parts_t[j]
        sc_[sstart[j]:sstart[j + 1]] = parts_c[j]
    comps, cptr, eblk, ecode = by_term(sstart, st, sc_)
    return order, starts, comps, cptr, eblk, ecode, scales
