"""Numba kernels for the NEQ scan: score every item by norm codeword x sum of lookup-table
entries and keep the top k in a bounded min-heap."""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, inline="always")
def _sift_down(hs, hi, k):
    """Restore the min-heap (hs float32 (k,), hi int64 (k,)) after its root was replaced."""
    pos = 0
    s, i = hs[0], hi[0]
    while True:
        c = 2 * pos + 1
        if c >= k:
            break
        # among children pick the worse one: smaller score, or larger position on a tie
        if c + 1 < k and (hs[c + 1] < hs[c] or (hs[c + 1] == hs[c] and hi[c + 1] > hi[c])):
            c += 1
        if hs[c] < s or (hs[c] == s and hi[c] > i):
            hs[pos], hi[pos] = hs[c], hi[c]
            pos = c
        else:
            break
    hs[pos], hi[pos] = s, i


@njit(cache=True, inline="always")
def _scan_range(lut, codes, norm_codes, norm_codebook, k, start, end, hs, hi):
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
            _sift_down(hs, hi, k)


@njit(cache=True, inline="always")
def _heap_sorted(hs, hi, k, out_s, out_i):
    """Heap sort (repeatedly move the worst to the back) into out_s / out_i, best first."""
    for end in range(k - 1, 0, -1):
        s, i = hs[0], hi[0]
        hs[0], hi[0] = hs[end], hi[end]
        hs[end], hi[end] = s, i
        _sift_down(hs, hi, end)
    out_s[:] = hs
    out_i[:] = hi


@njit(cache=True)
def scan_one(lut, codes, norm_codes, norm_codebook, k, out_s, out_i):
    """Top-k items for one query. lut float32 (M, K); codes uint8 (n, M); norm_codes uint8 (n,);
    norm_codebook float32 (K,). Writes out_s float32 (k,) best first and out_i int64 (k,) item
    positions (-1 and -inf where n < k). Ties go to the smaller position."""
    hs = np.full(k, -np.inf, np.float32)
    hi = np.full(k, -1, np.int64)
    _scan_range(lut, codes, norm_codes, norm_codebook, k, 0, codes.shape[0], hs, hi)
    _heap_sorted(hs, hi, k, out_s, out_i)


@njit(cache=True)
def scan_ranges(lut, codes, norm_codes, norm_codebook, k, starts, ends, out_s, out_i):
    """As :func:`scan_one` over the items at positions [starts[r], ends[r]) only (int64 (R,)).
    Ties go to the smaller position when the ranges are visited in increasing order."""
    hs = np.full(k, -np.inf, np.float32)
    hi = np.full(k, -1, np.int64)
    for r in range(starts.shape[0]):
        _scan_range(lut, codes, norm_codes, norm_codebook, k, starts[r], ends[r], hs, hi)
    _heap_sorted(hs, hi, k, out_s, out_i)


@njit(cache=True)
def scan_batch(lut, codes, norm_codes, norm_codebook, k):
    """Top-k for each query, one thread. lut float32 (nq, M, K). Returns (positions int64
    (nq, k), scores float32 (nq, k)), best first."""
    nq = lut.shape[0]
    out_i = np.empty((nq, k), np.int64)
    out_s = np.empty((nq, k), np.float32)
    for q in range(nq):
        scan_one(lut[q], codes, norm_codes, norm_codebook, k, out_s[q], out_i[q])
    return out_i, out_s


@njit(cache=True, parallel=True)
def scan_batch_parallel(lut, codes, norm_codes, norm_codebook, k):
    """As :func:`scan_batch`, queries spread over numba threads."""
    nq = lut.shape[0]
    out_i = np.empty((nq, k), np.int64)
    out_s = np.empty((nq, k), np.float32)
    for q in prange(nq):
        scan_one(lut[q], codes, norm_codes, norm_codebook, k, out_s[q], out_i[q])
    return out_i, out_s


@njit(cache=True, inline="always")
def _probe_ranges(offsets, probes_q):
    """Position ranges of the probed lists (ascending list order, so ascending positions)."""
    lists = np.sort(probes_q)
    return offsets[lists], offsets[lists + 1]


@njit(cache=True)
def scan_lists_batch(lut, codes, norm_codes, norm_codebook, k, offsets, probes):
    """Top-k for each query among the items of its probed lists, one thread. Items are stored
    grouped by list: list l holds positions [offsets[l], offsets[l + 1]). probes int64
    (nq, n_probe). Returns (positions int64 (nq, k), scores float32 (nq, k)), best first."""
    nq = lut.shape[0]
    out_i = np.empty((nq, k), np.int64)
    out_s = np.empty((nq, k), np.float32)
    for q in range(nq):
        st, en = _probe_ranges(offsets, probes[q])
        scan_ranges(lut[q], codes, norm_codes, norm_codebook, k, st, en, out_s[q], out_i[q])
    return out_i, out_s


@njit(cache=True, parallel=True)
def scan_lists_batch_parallel(lut, codes, norm_codes, norm_codebook, k, offsets, probes):
    """As :func:`scan_lists_batch`, queries spread over numba threads."""
    nq = lut.shape[0]
    out_i = np.empty((nq, k), np.int64)
    out_s = np.empty((nq, k), np.float32)
    for q in prange(nq):
        st, en = _probe_ranges(offsets, probes[q])
        scan_ranges(lut[q], codes, norm_codes, norm_codebook, k, st, en, out_s[q], out_i[q])
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

