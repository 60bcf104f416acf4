"""numba kernels of ip-NSW+: the seeded inner-product graph search, the replay of an HNSW
(hnswlib) search on its extracted graph, blocks of queries, and the inner-product graph
insertion. Kernels that run on threads release the GIL (``nogil``).

Conventions. Items are rows of ``xb`` (float32 (n, d)) addressed by their position (int32).
A graph is ``links`` int32 (n, width) with ``degree`` int32 (n,). A search keeps its beam in a
*pool*: three arrays (ids int32, scores float32, expanded bool) sorted by decreasing score, of
capacity ef; the next node to expand is the best unexpanded one. This expands exactly the nodes a
binary-heap best-first search (HNSW's candidate heap + bounded result heap) expands, with less
bookkeeping at small ef. ``visited`` int32 (n,) marks nodes with the current ``tag`` so it never
needs clearing between queries. Every search returns its number of distance computations.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._kernels import dot
from .._numba_util import prefetch as _prefetch

TAG_LIMIT = 2**31 - 8  # a visited array is zeroed when its tag would pass this


@njit(cache=True, inline="always")
def _prefetch_item(xb, visited, u):
    """Prefetch item u's vector (every cache line of it) and its visited mark."""
    _prefetch(visited, u, 0)
    for c in range(0, xb.shape[1], 16):
        _prefetch(xb, u, c)


@njit(cache=True, inline="always")
def pool_insert(pool_ids, pool_scores, pool_done, size, cap, node, score):
    """Insert (node, score) into a pool sorted by decreasing score, capacity ``cap``; the last
    entry falls out when full. Returns (new size, position) with position -1 when rejected."""
    if size == cap and score <= pool_scores[size - 1]:
        return size, -1
    lo, hi = 0, size
    while lo < hi:  # first position whose score is below the new one (ties stay first-come)
        mid = (lo + hi) >> 1
        if pool_scores[mid] >= score:
            lo = mid + 1
        else:
            hi = mid
    end = size if size < cap else cap - 1
    for t in range(end, lo, -1):
        pool_ids[t] = pool_ids[t - 1]
        pool_scores[t] = pool_scores[t - 1]
        pool_done[t] = pool_done[t - 1]
    pool_ids[lo] = node
    pool_scores[lo] = score
    pool_done[lo] = False
    return min(size + 1, cap), lo


@njit(cache=True, fastmath=True, inline="always")
def _score(xb, scale, use_scale, q, u):
    s = dot(q, xb[u])
    if use_scale:
        s *= scale[u]
    return s


@njit(cache=True, fastmath=True)
def _expand(xb, scale, use_scale, links, degree, q, node, visited, tag,
            pool_ids, pool_scores, pool_done, size, cap, cur, fresh):  # fmt: skip
    """Score the unvisited neighbours of ``node`` into the pool (``fresh``: int32 scratch of
    links.shape[1]). Returns (size, cur, ndis) where cur is lowered when a neighbour lands
    before it."""
    d = degree[node]
    row = links[node]
    for t in range(d):  # visited marks first: they are small and often cached
        _prefetch(visited, row[t], 0)
    nf = 0
    for t in range(d):
        u = row[t]
        if visited[u] != tag:
            visited[u] = tag
            fresh[nf] = u
            nf += 1
            # fetch every new neighbour's vector before scoring any: the loads overlap
            for c in range(0, xb.shape[1], 16):
                _prefetch(xb, u, c)
    for t in range(nf):
        u = fresh[t]
        s = _score(xb, scale, use_scale, q, u)
        size, pos = pool_insert(pool_ids, pool_scores, pool_done, size, cap, u, s)
        if pos >= 0 and pos < cur:
            cur = pos
    return size, cur, nf


@njit(cache=True, fastmath=True)
def _best_first(xb, scale, use_scale, links, degree, q, visited, tag,
                pool_ids, pool_scores, pool_done, size, cap):  # fmt: skip
    """Expand the best unexpanded pool entry until every entry is expanded. Returns
    (size, ndis)."""
    ndis = 0
    cur = 0
    fresh = np.empty(links.shape[1], np.int32)
    while True:
        while cur < size and pool_done[cur]:
            cur += 1
        if cur >= size:
            break
        pool_done[cur] = True
        node = pool_ids[cur]
        size, cur, nd = _expand(xb, scale, use_scale, links, degree, q, node, visited, tag,
                                pool_ids, pool_scores, pool_done, size, cap, cur,
                                fresh)  # fmt: skip
        ndis += nd
    return size, ndis


@njit(cache=True, fastmath=True)
def seeded_search(xb, links, degree, q, seeds, n_seeds, ef, visited, tag,
                  pool_ids, pool_scores, pool_done):  # fmt: skip
    """ip-NSW+ search on the inner-product graph: score the seeds (``seeds[:n_seeds]``, -1
    skipped), expand every seed's neighbours, then best-first with beam ``ef``. Fills the pool
    (best first) and returns (pool size, distance computations)."""
    size = 0
    ndis = 0
    scale = xb[0, :0]  # unused: plain inner product
    for a in range(n_seeds):
        s = seeds[a]
        if s < 0 or visited[s] == tag:
            continue
        visited[s] = tag
        ndis += 1
        size, pos = pool_insert(pool_ids, pool_scores, pool_done, size, ef, s, dot(q, xb[s]))
        if pos >= 0:
            pool_done[pos] = True  # expanded just below
    cur = 0
    fresh = np.empty(links.shape[1], np.int32)
    for a in range(n_seeds):
        s = seeds[a]
        if s < 0:
            continue
        size, cur, nd = _expand(xb, scale, False, links, degree, q, s, visited, tag,
                                pool_ids, pool_scores, pool_done, size, ef, cur,
                                fresh)  # fmt: skip
        ndis += nd
    size, nd = _best_first(xb, scale, False, links, degree, q, visited, tag,
                           pool_ids, pool_scores, pool_done, size, ef)  # fmt: skip
    return size, ndis + nd


@njit(cache=True, fastmath=True)
def hnsw_search(xb, scale, use_scale, links0, degree0, upper_links, upper_degree,
                upper_start, entry, max_level, q, ef, visited, tag, pool_ids, pool_scores,
                pool_done):  # fmt: skip
    """An HNSW search as hnswlib runs it (greedy descent through the upper levels, then
    best-first on level 0 with beam ``ef``), on a graph extracted from hnswlib. Score: inner
    product, times ``scale[u]`` when ``use_scale`` (1/|x_u| gives hnswlib's cosine ranking).
    Level l >= 1 links of node u are row ``upper_start[u] + l - 1``. Fills the pool and returns
    (pool size, distance computations)."""
    cur_node = entry
    best = _score(xb, scale, use_scale, q, cur_node)
    ndis = 1
    for level in range(max_level, 0, -1):
        changed = True
        while changed:
            changed = False
            row = upper_start[cur_node] + level - 1
            for t in range(upper_degree[row]):
                _prefetch(xb, upper_links[row, t], 0)
            for t in range(upper_degree[row]):
                u = upper_links[row, t]
                s = _score(xb, scale, use_scale, q, u)
                ndis += 1
                if s > best:
                    best = s
                    cur_node = u
                    changed = True
    visited[cur_node] = tag
    size, _ = pool_insert(pool_ids, pool_scores, pool_done, 0, ef, cur_node, best)
    size, nd = _best_first(xb, scale, use_scale, links0, degree0, q, visited, tag,
                           pool_ids, pool_scores, pool_done, size, ef)  # fmt: skip
    return size, ndis + nd


@njit(cache=True, fastmath=True)
def _next_tag(visited, tag):
    tag += 1
    if tag >= TAG_LIMIT:
        visited[:] = 0
        tag = 1
    return tag


@njit(cache=True, fastmath=True, nogil=True)
def query_block(lo, hi, Q, k, ef, angular_ef, xb, inv_norm, live,
                a_links0, a_degree0, a_upper_links, a_upper_degree, a_upper_start, a_entry,
                a_max_level, ip_links, ip_degree, visited, tag,
                out_ids, out_scores, out_ndis):  # fmt: skip
    """ip-NSW+ queries lo..hi-1 of Q float32 (nq, d): the angular HNSW search (beam
    ``angular_ef``) gives seeds, then the seeded inner-product search (beam ``ef``). Writes
    positions int32 (-1 padding; deleted items skipped), inner products float32 and distance
    computations (angular, inner product) into rows lo..hi-1 of ``out_ids`` (nq, k),
    ``out_scores`` (nq, k), ``out_ndis`` int64 (nq, 2). ``visited`` int32 (n,) is this
    thread's; returns the last tag used. Releases the GIL: threads run blocks in parallel."""
    cap = max(ef, angular_ef)
    pool_ids = np.empty(cap, np.int32)
    pool_scores = np.empty(cap, np.float32)
    pool_done = np.empty(cap, np.bool_)
    seeds = np.empty(angular_ef, np.int32)
    for i in range(lo, hi):
        q = Q[i]
        tag = _next_tag(visited, tag)
        n_seeds, nd_a = hnsw_search(xb, inv_norm, True, a_links0, a_degree0, a_upper_links,
                                    a_upper_degree, a_upper_start, a_entry, a_max_level, q,
                                    angular_ef, visited, tag, pool_ids, pool_scores,
                                    pool_done)  # fmt: skip
        seeds[:n_seeds] = pool_ids[:n_seeds]
        tag = _next_tag(visited, tag)
        size, nd_ip = seeded_search(xb, ip_links, ip_degree, q, seeds, n_seeds, ef, visited, tag,
                                    pool_ids, pool_scores, pool_done)  # fmt: skip
        out_ndis[i, 0] = nd_a
        out_ndis[i, 1] = nd_ip
        j = 0
        for t in range(size):
            if j == k:
                break
            u = pool_ids[t]
            if live[u]:
                out_ids[i, j] = u
                out_scores[i, j] = pool_scores[t]
                j += 1
        for t in range(j, k):
            out_ids[i, t] = -1
            out_scores[i, t] = -np.inf
    return tag


@njit(cache=True, fastmath=True, nogil=True)
def hnsw_query_batch(Q, k, ef, xb, scale, use_scale, links0, degree0, upper_links,
                     upper_degree, upper_start, entry, max_level, visited):  # fmt: skip
    """Replay hnswlib's search for a batch (bench: counts the baseline's distance computations
    on its own graph). Returns positions int32 (nq, k) and distance computations int64 (nq,).
    ``visited`` int32 (n,), zeroed."""
    nq = Q.shape[0]
    out_ids = np.full((nq, k), -1, np.int32)
    out_ndis = np.zeros(nq, np.int64)
    pool_ids = np.empty(ef, np.int32)
    pool_scores = np.empty(ef, np.float32)
    pool_done = np.empty(ef, np.bool_)
    tag = 0
    for i in range(nq):
        tag = _next_tag(visited, tag)
        size, nd = hnsw_search(xb, scale, use_scale, links0, degree0, upper_links, upper_degree,
                               upper_start, entry, max_level, Q[i], ef, visited, tag, pool_ids,
                               pool_scores, pool_done)  # fmt: skip
        out_ndis[i] = nd
        for t in range(min(k, size)):
            out_ids[i, t] = pool_ids[t]
    return out_ids, out_ndis


# -- building the inner-product graph ------------------------------------------------------


@njit(cache=True, fastmath=True)
def _link(links, degree, link_scores, j, i, s):
    """Give j a link to i with inner product s: append while j has fewer than ``width`` links,
    else replace j's weakest link when s is larger (the reverse-link cap keeping the largest)."""
    width = links.shape[1]
    d = degree[j]
    if d < width:
        links[j, d] = i
        link_scores[j, d] = s
        degree[j] = d + 1
        return
    worst = 0
    for t in range(1, width):
        if link_scores[j, t] < link_scores[j, worst]:
            worst = t
    if s > link_scores[j, worst]:
        links[j, worst] = i
        link_scores[j, worst] = s


@njit(cache=True, fastmath=True, nogil=True)
def search_phase(lo, hi, xb, links, degree, start, seeds, ef, visited, tag, cand_ids,
                  cand_scores, cand_size):  # fmt: skip
    """Searches of batch rows lo..hi-1 (items start + r) on the graph as it was before the
    batch, into the candidate arrays. Returns (last tag, distance computations). Releases the
    GIL."""
    pool_ids = np.empty(ef, np.int32)
    pool_scores = np.empty(ef, np.float32)
    pool_done = np.empty(ef, np.bool_)
    sd = np.empty(seeds.shape[1] + 1, np.int32)
    ndis = 0
    for r in range(lo, hi):
        ns = 0
        for a in range(seeds.shape[1]):
            s = seeds[r, a]
            if 0 <= s < start:
                sd[ns] = s
                ns += 1
        if ns == 0 and start > 0:
            sd[0] = 0
            ns = 1
        if ns == 0:
            continue
        tag = _next_tag(visited, tag)
        size, nd = seeded_search(xb, links, degree, xb[start + r], sd, ns, ef, visited, tag,
                                 pool_ids, pool_scores, pool_done)  # fmt: skip
        ndis += nd
        cand_size[r] = size
        cand_ids[r, :size] = pool_ids[:size]
        cand_scores[r, :size] = pool_scores[:size]
    return tag, ndis


@njit(cache=True, fastmath=True, nogil=True)
def link_phase(xb, links, degree, link_scores, start, stop, n_links, cand_ids, cand_scores,
                cand_size):  # fmt: skip
    """Sequential, in item order: item i's candidates are its search results plus the batch
    items before it (exact inner products); its top ``n_links`` become its links, and each
    linked item gets the reverse link. Returns the exact inner products computed."""
    m = stop - start
    total = 0
    top_ids = np.empty(n_links, np.int32)
    top_scores = np.empty(n_links, np.float32)
    top_done = np.empty(n_links, np.bool_)
    for r in range(m):
        i = start + r
        size = 0
        for t in range(cand_size[r]):
            size, _ = pool_insert(top_ids, top_scores, top_done, size, n_links, cand_ids[r, t],
                                  cand_scores[r, t])  # fmt: skip
        for r2 in range(r):
            size, _ = pool_insert(top_ids, top_scores, top_done, size, n_links, start + r2,
                                  dot(xb[i], xb[start + r2]))  # fmt: skip
        total += r
        for t in range(size):
            links[i, t] = top_ids[t]
            link_scores[i, t] = top_scores[t]
        degree[i] = size
        for t in range(size):
            _link(links, degree, link_scores, top_ids[t], i, top_scores[t])
    return total


@njit(cache=True, fastmath=True, nogil=True)
def recompute_link_scores(xb, links, degree):
    """Inner products of every link, float32 (n, width) (not saved; rebuilt after load)."""
    n, width = links.shape
    out = np.full((n, width), -np.inf, np.float32)
    for i in range(n):
        for t in range(degree[i]):
            out[i, t] = dot(xb[i], xb[links[i, t]])
    return out
