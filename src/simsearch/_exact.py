"""Exact scoring and top-k selection: the flat index's scan, the exact path of filtered
searches (simsearch.filters) and the oracle every test checks against."""

from __future__ import annotations

import numpy as np

from . import _simd
from ._kernels import topk_ids, topk_rows


def topk_from_scores(
    scores: np.ndarray, k: int, higher_is_better: bool, ids: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k columns per row of a (b, n) score block, best first; ties broken by the smaller
    column (or id), so the oracle is deterministic. Returns (columns or ids int64 (b, k),
    scores float32 (b, k)), padded with -1 / worst score when n < k."""
    scores = np.ascontiguousarray(scores, np.float32)
    sign = 1.0 if higher_is_better else -1.0
    if ids is None:
        return topk_rows(scores, k, sign, np.arange(scores.shape[1], dtype=np.int64))
    return topk_ids(scores, k, sign, ids)


def exact_scores(q: np.ndarray, x: np.ndarray, metric: str, x_sqnorms: np.ndarray | None = None):
    """Scores (nq, n) under metric: inner product, cosine (inputs already unit) or squared L2."""
    s = q @ x.T
    if metric == "l2":
        xn = (x * x).sum(1) if x_sqnorms is None else x_sqnorms
        s = (q * q).sum(1)[:, None] - 2.0 * s + xn[None, :]
        np.maximum(s, 0.0, out=s)
    return s


# Rows of the score matrix computed at once: bounds memory at ~256 MB per block.
BLOCK_ELEMENTS = 1 << 26


def exact_topk(q: np.ndarray, x: np.ndarray, ids: np.ndarray, k: int, metric: str,
               x_sqnorms: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k of queries q (stored form: unit rows under cosine) over rows x with ids,
    in blocks of queries. Returns (ids int64 (nq, k), scores float32 (nq, k)), padded."""
    hib = metric != "l2"
    nq, n = q.shape[0], x.shape[0]
    if 1 <= k <= n and (nq <= 2 or (nq <= 8 and nq * n * x.shape[1] <= 1 << 25)):
        # a few queries: one compiled pass, no score matrix (faiss's IndexFlat does the same
        # below 20 queries); above these sizes BLAS's blocking wins (docs/kernels.md)
        xsq = None if hib else ((x * x).sum(1) if x_sqnorms is None else x_sqnorms)
        return _simd.flat_topk(np.ascontiguousarray(q, np.float32),
                               np.ascontiguousarray(x, np.float32),
                               np.ascontiguousarray(ids, np.int64), xsq, k)
    step = max(1, BLOCK_ELEMENTS // max(n, 1))
    if nq <= step:  # one block: no copy
        return topk_from_scores(exact_scores(q, x, metric, x_sqnorms), k, hib, ids)
    out_i = np.empty((nq, k), np.int64)
    out_s = np.empty((nq, k), np.float32)
    for s in range(0, nq, step):
        sc = exact_scores(q[s : s + step], x, metric, x_sqnorms)
        out_i[s : s + step], out_s[s : s + step] = topk_from_scores(sc, k, hib, ids)
    return out_i, out_s
