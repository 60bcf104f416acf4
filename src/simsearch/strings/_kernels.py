"""numba kernels for the CGK embedding and Hamming-distance search."""

from __future__ import annotations

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
