"""Numba kernels of the top-level indexes (exact search)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _worse(va, ta, vb, tb):
    """Is (value a, tiebreak a) worse than b? Larger value wins; equal values: smaller tiebreak."""
    return va < vb or (va == vb and ta > tb)


@njit(cache=True, inline="always")
def _sift_down(hv, ht, hp, i, size):
    """Restore the worst-at-root heap below position i."""
    while True:
        c = 2 * i + 1
        if c >= size:
            return
        if c + 1 < size and _worse(hv[c + 1], ht[c + 1], hv[c], ht[c]):
            c += 1
        if not _worse(hv[c], ht[c], hv[i], ht[i]):
            return
        hv[i], hv[c] = hv[c], hv[i]
        ht[i], ht[c] = ht[c], ht[i]
        hp[i], hp[c] = hp[c], hp[i]
        i = c


@njit(cache=True)
def topk_rows(scores, k, sign, tiebreak):
    """Best k columns of each row of scores (b, n) float32, best first, in one pass with a heap.
    ``sign`` +1 keeps the largest scores, -1 the smallest; ties go to the smaller ``tiebreak``
    (int64 (n,)). Returns (positions int64 (b, k), -1 padded; scores float32 (b, k))."""
    b, n = scores.shape
    kk = min(k, n)
    pos = np.full((b, k), -1, np.int64)
    out = np.empty((b, k), np.float32)
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
                        _sift_down(hv, ht, hp, i, kk)
            elif v >= hv[0]:  # most items fail this and cost one compare
                t = tiebreak[j]
                if v > hv[0] or t < ht[0]:
                    hv[0], ht[0], hp[0] = v, t, j
                    _sift_down(hv, ht, hp, 0, kk)
        if size < kk:
            for i in range(size // 2 - 1, -1, -1):
                _sift_down(hv, ht, hp, i, size)
        for slot in range(size - 1, -1, -1):  # pop the worst into the back
            pos[r, slot] = hp[0]
            out[r, slot] = sign * hv[0]
            size -= 1
            hv[0], ht[0], hp[0] = hv[size], ht[size], hp[size]
            _sift_down(hv, ht, hp, 0, size)
    return pos, out
