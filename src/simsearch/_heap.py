"""The one bounded top-k heap of the numba kernels (as pynndescent keeps one in utils.py).

A heap holds the best ``len(hs)`` (score, id) pairs seen, in two arrays, with the worst kept at
the root so an item that cannot enter costs one compare. Larger scores are better; equal scores
go to the smaller id, so every kernel breaks ties the same way (docs/architecture.md, "Results").
All functions inline into the kernel that calls them.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, inline="always")
def worse(s1, i1, s2, i2):
    """(s1, i1) ranks below (s2, i2): a lower score, or the same score and a larger id."""
    return s1 < s2 or (s1 == s2 and i1 > i2)


@njit(cache=True, inline="always")
def sift_down(hs, hi, pos, size):
    """Restore the heap hs[:size], hi[:size] below ``pos`` after that entry changed."""
    s, i = hs[pos], hi[pos]
    while True:
        c = 2 * pos + 1
        if c >= size:
            break
        if c + 1 < size and worse(hs[c + 1], hi[c + 1], hs[c], hi[c]):
            c += 1  # the worse child
        if worse(hs[c], hi[c], s, i):
            hs[pos], hi[pos] = hs[c], hi[c]
            pos = c
        else:
            break
    hs[pos], hi[pos] = s, i


@njit(cache=True, inline="always")
def push(hs, hi, size, s, i):
    """Offer (s, i) to a heap of capacity len(hs) holding ``size`` entries; returns the new size."""
    k = hs.shape[0]
    if size < k:
        pos = size
        while pos > 0:
            par = (pos - 1) >> 1
            if not worse(s, i, hs[par], hi[par]):
                break
            hs[pos], hi[pos] = hs[par], hi[par]
            pos = par
        hs[pos], hi[pos] = s, i
        return size + 1
    if worse(hs[0], hi[0], s, i):
        hs[0], hi[0] = s, i
        sift_down(hs, hi, 0, k)
    return size


@njit(cache=True, inline="always")
def sort_best_first(hs, hi, size):
    """Heap-sort hs[:size], hi[:size] in place, best first (the worst moves to the back)."""
    for end in range(size - 1, 0, -1):
        s, i = hs[0], hi[0]
        hs[0], hi[0] = hs[end], hi[end]
        hs[end], hi[end] = s, i
        sift_down(hs, hi, 0, end)


@njit(cache=True, inline="always")
def sift_down_carry(hs, hi, hp, pos, size):
    """sift_down for a heap that carries a payload array ``hp`` (a position) beside each id."""
    s, i, p = hs[pos], hi[pos], hp[pos]
    while True:
        c = 2 * pos + 1
        if c >= size:
            break
        if c + 1 < size and worse(hs[c + 1], hi[c + 1], hs[c], hi[c]):
            c += 1
        if worse(hs[c], hi[c], s, i):
            hs[pos], hi[pos], hp[pos] = hs[c], hi[c], hp[c]
            pos = c
        else:
            break
    hs[pos], hi[pos], hp[pos] = s, i, p
