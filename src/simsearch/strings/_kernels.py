"""numba kernels for the CGK embedding and Hamming-distance search."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def cgk_embed(codes, lengths, bits, out):
    """CGK random walk. codes uint8 (n, M) (0 pads), lengths int64 (n,), bits uint8 (3M, C + 1),
    out uint8 (n, 3M): step j copies the current character c and advances by bits[j, c];
    positions past the end of the string hold 0 (the pad symbol)."""
    n = codes.shape[0]
    L = out.shape[1]
    for r in range(n):
        i = 0
        m = lengths[r]
        for j in range(L):
            if i < m:
                c = codes[r, i]
                out[r, j] = c
                i += bits[j, c]
            else:
                out[r, j] = 0


@njit(cache=True)
def hamming_distances(xq, xb, out):
    """Hamming distances between rows: xq uint8 (nq, L), xb uint8 (n, L) -> out int32 (nq, n)."""
    nq, L = xq.shape
    n = xb.shape[0]
    for a in range(nq):
        q = xq[a]
        for b in range(n):
            x = xb[b]
            d = 0
            for j in range(L):
                d += q[j] != x[j]
            out[a, b] = d


@njit(cache=True)
def bigram_profile(codes, lengths, stride, n_buckets, out):
    """Hashed bigram counts: codes uint8 (n, M) (0 pads), lengths int64 (n,), out float32
    (n, n_buckets) zeroed by the caller; bigram (a, b) lands in bucket (a * stride + b) %
    n_buckets (stride = alphabet size + 1: no collisions when n_buckets >= stride**2).
    Edit distance bounds their L1 difference (one edit changes at most 4 bigram counts), so
    near strings have near profiles: a cheap candidate filter for neighbour lists."""
    n = codes.shape[0]
    for r in range(n):
        for i in range(lengths[r] - 1):
            b = (np.int64(codes[r, i]) * stride + np.int64(codes[r, i + 1])) % n_buckets
            out[r, b] += 1.0
