"""Numba kernels for the NEQ scan: score every item by norm codeword x sum of lookup-table
entries and keep the top k: a min-heap for small k, a threshold buffer cut back to k when
full for large k (a re-rank's candidates), each the faster where it is used
(docs/bench/quant.md, "Scan speed")."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .. import _heap
from .._kernels import dot

_CHUNK = 64  # items scored before their scores are filtered
_HEAP_K = 32  # up to this k a min-heap keeps the best: its sift is short and rarely taken


@njit(cache=True, inline="always")
def _heap_range(lut, codes, norm_codes, norm_codebook, k, start, end, hs, hi):
    """Offer the items at positions [start, end) to the min-heap (hs, hi) of size k."""
    M = codes.shape[1]
    for i in range(start, end):
        acc = np.float32(0.0)
        for m in range(M):
            acc += lut[m, codes[i, m]]
        s = norm_codebook[norm_codes[i]] * acc
        # strictly better than the worst kept: earlier positions win ties
        if s > hs[0]:
            hs[0] = s
            hi[0] = i
            _heap.sift_down(hs, hi, 0, k)


@njit(cache=True, inline="always")
def _heap_sorted(hs, hi, k, out_s, out_i):
    """Heap sort (repeatedly move the worst to the back) into out_s / out_i, best first."""
    _heap.sort_best_first(hs, hi, k)
    out_s[:] = hs
    out_i[:] = hi


@njit(cache=True)
def _kth_largest(a, k, tmp):
    """The k-th largest of a (quickselect on the scratch tmp, as long as a)."""
    n = a.shape[0]
    tmp[:n] = a
    lo, hi, kk = 0, n - 1, k - 1
    while lo < hi:
        p = tmp[(lo + hi) // 2]
        i, j = lo, hi
        while i <= j:
            while tmp[i] > p:
                i += 1
            while tmp[j] < p:
                j -= 1
            if i <= j:
                tmp[i], tmp[j] = tmp[j], tmp[i]
                i += 1
                j -= 1
        if kk <= j:
            hi = j
        elif kk >= i:
            lo = i
        else:
            break
    return tmp[kk]


@njit(cache=True)
def _keep_best(bs, bi, cnt, k, tmp):
    """Keep the k best of the buffer bs[:cnt] / bi[:cnt] in place, in buffer order; ties at the
    cut go to the earlier entry. Returns (new count, the k-th best score)."""
    t = _kth_largest(bs[:cnt], k, tmp)
    above = 0
    for j in range(cnt):
        if bs[j] > t:
            above += 1
    room = k - above  # how many entries scoring exactly t stay
    w = 0
    for j in range(cnt):
        if bs[j] > t or (bs[j] == t and room > 0):
            if bs[j] == t:
                room -= 1
            bs[w], bi[w] = bs[j], bi[j]
            w += 1
    return w, t


@njit(cache=True, inline="always")
def _scan_range(lut, codes, norm_codes, norm_codebook, k, start, end, bs, bi, tmp, cnt, thr):
    """Offer the items at positions [start, end) to the top-k buffer (bs, bi) holding cnt
    entries (tmp: scratch as long); only scores above thr (the k-th best so far) enter.
    Returns (cnt, thr).

    A buffer several times k, cut back to k when full, replaces a k-heap: after the first few
    hundred items few scores pass the threshold, and a heap's sift per passing item was most of
    the scan's time at k = 100 (docs/bench/quant.md)."""
    M = codes.shape[1]
    cap = bs.shape[0]
    sc = np.empty(_CHUNK, np.float32)
    for c0 in range(start, end, _CHUNK):
        c1 = min(c0 + _CHUNK, end)
        # score a chunk in a tight loop, then filter: the filter's branches kept out of the
        # lookup loop let it run at the speed of its loads
        for j in range(c1 - c0):
            acc = np.float32(0.0)
            for m in range(M):
                acc += lut[m, codes[c0 + j, m]]
            sc[j] = norm_codebook[norm_codes[c0 + j]] * acc
        for j in range(c1 - c0):
            s = sc[j]
            # strictly above: positions arrive in increasing order, so an equal score loses
            if s > thr:
                if cnt == cap:
                    cnt, thr = _keep_best(bs, bi, cnt, k, tmp)
                    if not s > thr:
                        continue
                bs[cnt], bi[cnt] = s, c0 + j
                cnt += 1
    return cnt, thr


@njit(cache=True, inline="always")
def _finish(bs, bi, tmp, cnt, k, out_s, out_i, ordered):
    """The buffer's k best into out_s / out_i, best first (ties by position) when ``ordered``,
    else in position order; -inf / -1 pad."""
    if cnt > k:
        cnt, _ = _keep_best(bs, bi, cnt, k, tmp)
    if ordered:
        # stable: among equal scores the buffer is in position order. (numba's sort costs ~50
        # us for 1,000 entries, so candidates bound for an exact re-rank skip it.)
        order = np.argsort(-bs[:cnt], kind="mergesort")
        bs[:cnt], bi[:cnt] = bs[:cnt][order], bi[:cnt][order]
    for j in range(k):
        if j < cnt:
            out_s[j], out_i[j] = bs[j], bi[j]
        else:
            out_s[j], out_i[j] = -np.inf, -1


@njit(cache=True, inline="always")
def _buffer(k):
    cap = max(4 * k, 256)
    return np.empty(cap, np.float32), np.empty(cap, np.int64), np.empty(cap, np.float32)


@njit(cache=True)
def scan_lists(lut, codes, norm_codes, norm_codebook, k, offsets, lists, out_s, out_i,
               ordered=True):
    """Top-k items for one query among the items of ``lists`` (int64, any order); list l holds
    the positions [offsets[l], offsets[l + 1]). lut float32 (M, K); codes uint8 (n, M);
    norm_codes uint8 (n,); norm_codebook float32 (K,). Writes out_s float32 (k,) best first and
    out_i int64 (k,) item positions (-1 and -inf past the items there); ties go to the smaller
    position (the lists are visited in increasing order, so positions ascend). Unless
    ``ordered``, a k above _HEAP_K may come out in position order instead."""
    lists = np.sort(lists)
    if k <= _HEAP_K:
        hs = np.full(k, -np.inf, np.float32)
        hi = np.full(k, -1, np.int64)
        for ls in lists:
            _heap_range(lut, codes, norm_codes, norm_codebook, k, offsets[ls], offsets[ls + 1],
                        hs, hi)  # fmt: skip
        _heap_sorted(hs, hi, k, out_s, out_i)
        return
    bs, bi, tmp = _buffer(k)
    cnt, thr = 0, np.float32(-np.inf)
    for ls in lists:
        cnt, thr = _scan_range(lut, codes, norm_codes, norm_codebook, k, offsets[ls],
                               offsets[ls + 1], bs, bi, tmp, cnt, thr)
    _finish(bs, bi, tmp, cnt, k, out_s, out_i, ordered)


@njit(cache=True, inline="always")
def _outputs(nq, k):
    """Uninitialised (positions int64 (nq, k), scores float32 (nq, k)) for a batch's results."""
    return np.empty((nq, k), np.int64), np.empty((nq, k), np.float32)


def whole(n: int, nq: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, probes) that make every one of n items a single list probed by nq queries."""
    return np.array([0, n], np.int64), np.zeros((nq, 1), np.int64)


@njit(cache=True)
def scan_lists_batch(lut, codes, norm_codes, norm_codebook, k, offsets, probes, ordered=True):
    """:func:`scan_lists` for each query, one thread: lut float32 (nq, M, K), probes int64
    (nq, n_probe) (:func:`whole` to scan every item). Returns (positions int64 (nq, k), scores
    float32 (nq, k)), best first."""
    out_i, out_s = _outputs(lut.shape[0], k)
    for q in range(lut.shape[0]):
        scan_lists(lut[q], codes, norm_codes, norm_codebook, k, offsets, probes[q], out_s[q],
                   out_i[q], ordered)
    return out_i, out_s


@njit(cache=True, parallel=True)
def scan_lists_batch_parallel(lut, codes, norm_codes, norm_codebook, k, offsets, probes,
                              ordered=True):
    """As :func:`scan_lists_batch`, queries spread over numba threads."""
    out_i, out_s = _outputs(lut.shape[0], k)
    for q in prange(lut.shape[0]):
        scan_lists(lut[q], codes, norm_codes, norm_codebook, k, offsets, probes[q], out_s[q],
                   out_i[q], ordered)
    return out_i, out_s


@njit(cache=True, inline="always")
def _rerank_one(pos, x, q, k, out_s, out_i):
    """The k best of the candidate positions pos (-1 = none) by exact score x[p]·q, best first,
    ties by position; -inf / -1 pad. An insertion into the k kept: kk·k steps at most."""
    cnt = 0
    for j in range(pos.shape[0]):
        p = pos[j]
        if p < 0:
            continue
        s = dot(x[p], q)
        if cnt == k and (s < out_s[k - 1] or (s == out_s[k - 1] and p > out_i[k - 1])):
            continue
        i = min(cnt, k - 1)
        while i > 0 and (out_s[i - 1] < s or (out_s[i - 1] == s and out_i[i - 1] > p)):
            out_s[i], out_i[i] = out_s[i - 1], out_i[i - 1]
            i -= 1
        out_s[i], out_i[i] = s, p
        cnt = min(cnt + 1, k)
    for j in range(cnt, k):
        out_s[j], out_i[j] = -np.inf, -1


@njit(cache=True)
def rerank_batch(pos, x, q, k):
    """Each query's k best of its candidates pos int64 (nq, kk) by exact inner product with
    the raw vectors x float32 (n, d): (positions int64 (nq, k), scores float32 (nq, k))."""
    out_i, out_s = _outputs(pos.shape[0], k)
    for i in range(pos.shape[0]):
        _rerank_one(pos[i], x, q[i], k, out_s[i], out_i[i])
    return out_i, out_s


@njit(cache=True, parallel=True)
def rerank_batch_parallel(pos, x, q, k):
    """As :func:`rerank_batch`, queries spread over numba threads."""
    out_i, out_s = _outputs(pos.shape[0], k)
    for i in prange(pos.shape[0]):
        _rerank_one(pos[i], x, q[i], k, out_s[i], out_i[i])
    return out_i, out_s


@njit(cache=True)
def kmeans_1d(values_sorted, centroids, n_iter):
    """Lloyd's k-means on sorted float64 values (n,), from the given sorted centroids (K,);
    assignment by midpoints, means by prefix sums, so each iteration is O(n + K log n). Empty
    clusters keep their centroid. Returns the sorted float64 centroids (K,)."""
    n = values_sorted.shape[0]
    K = centroids.shape[0]
    c = centroids.copy()
    csum = np.zeros(n + 1)
    for i in range(n):
        csum[i + 1] = csum[i] + values_sorted[i]
    bounds = np.empty(K + 1, np.int64)
    for _ in range(n_iter):
        bounds[0] = 0
        bounds[K] = n
        for j in range(1, K):
            bounds[j] = np.searchsorted(values_sorted, 0.5 * (c[j - 1] + c[j]))
        moved = 0.0
        for j in range(K):
            a, b = bounds[j], bounds[j + 1]
            if b > a:
                new = (csum[b] - csum[a]) / (b - a)
                moved = max(moved, abs(new - c[j]))
                c[j] = new
        c.sort()
        if moved == 0.0:
            break
    return c



@njit(cache=True)
def fastscan_reference(blocks, list_blocks, block_base, block_count, probes, luts, scale, bias,
                       norm_codebook, k):  # fmt: skip
    """The 4-bit fast-scan (simsearch.quant.fastscan) item by item: the reference the compiled
    kernels must equal. Returns positions int64 (nq, k) and estimates float32 (nq, k), best
    first (ties by position), -1 / -inf padding."""
    nq = luts.shape[0]
    n_pairs = blocks.shape[1] // 32 - 1
    n_lists = list_blocks.shape[0] - 1
    out_i = np.full((nq, k), -1, np.int64)
    out_s = np.full((nq, k), -np.inf, np.float32)
    for q in range(nq):
        lists = probes[q] if probes.shape[1] else np.arange(n_lists)
        total = 0
        for li in lists:
            if 0 <= li < n_lists:
                for b in range(list_blocks[li], list_blocks[li + 1]):
                    total += block_count[b]
        sc = np.empty(total, np.float32)
        ps = np.empty(total, np.int64)
        t = 0
        for li in lists:
            if not 0 <= li < n_lists:
                continue
            for b in range(list_blocks[li], list_blocks[li + 1]):
                blk = blocks[b]
                for i in range(block_count[b]):
                    j = 2 * i if i < 16 else 2 * (i - 16) + 1
                    acc = 0
                    for p in range(n_pairs):
                        c = blk[p * 32 + j]
                        acc += luts[q, 2 * p, c & 15] + luts[q, 2 * p + 1, c >> 4]
                    e = np.float32(acc) * scale[q] + bias[q]
                    sc[t] = norm_codebook[blk[n_pairs * 32 + i]] * e
                    ps[t] = block_base[b] + i
                    t += 1
        order = np.argsort(-sc, kind="mergesort")
        for r in range(min(k, total)):
            out_i[q, r] = ps[order[r]]
            out_s[q, r] = sc[order[r]]
    return out_i, out_s
