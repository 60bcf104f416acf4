"""Exact search: the baseline, and the oracle every test checks against."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._kernels import topk_rows
from .index import Index, SearchResult, normalize_rows, pad_score, register

# Rows of the score matrix computed at once: bounds memory at ~256 MB per block.
_BLOCK_ELEMENTS = 1 << 26


def topk_from_scores(
    scores: np.ndarray, k: int, higher_is_better: bool, ids: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Top-k columns per row of a (b, n) score block, best first; ties broken by the smaller
    column (or id), so the oracle is deterministic. Returns (columns or ids int64 (b, k),
    scores float32 (b, k)), padded with -1 / worst score when n < k."""
    tiebreak = np.arange(scores.shape[1], dtype=np.int64) if ids is None else ids
    pos, out = topk_rows(
        np.ascontiguousarray(scores, np.float32), k, 1.0 if higher_is_better else -1.0, tiebreak
    )
    out[pos < 0] = -np.inf if higher_is_better else np.inf
    if ids is not None:
        pos = np.where(pos >= 0, ids[np.maximum(pos, 0)], -1)
    return pos, out


def exact_scores(q: np.ndarray, x: np.ndarray, metric: str, x_sqnorms: np.ndarray | None = None):
    """Scores (nq, n) under metric: inner product, cosine (inputs already unit) or squared L2."""
    s = q @ x.T
    if metric == "l2":
        xn = (x * x).sum(1) if x_sqnorms is None else x_sqnorms
        s = (q * q).sum(1)[:, None] - 2.0 * s + xn[None, :]
        np.maximum(s, 0.0, out=s)
    return s


@register("flat")
class FlatIndex(Index):
    """Exact search by brute force over every stored vector (numpy BLAS, blocked).

    Metrics "ip" (inner product), "cosine" (vectors normalized on add) and "l2" (squared
    distance). Supports remove(). Searches may run concurrently; writes are serialized.
    """

    def __init__(self, dim: int, metric: str = "l2"):
        super().__init__(dim, metric)
        self._x = np.empty((0, dim), np.float32)
        self._ids = np.empty(0, np.int64)
        self._sq = np.empty(0, np.float32)
        self._n = 0

    def _prep(self, x: np.ndarray) -> np.ndarray:
        return normalize_rows(x) if self.metric == "cosine" else x

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        x = self._prep(x)
        n, m = self._n, x.shape[0]
        if n + m > self._x.shape[0]:  # grow geometrically so repeated small adds stay O(1) each
            cap = max(n + m, 2 * self._x.shape[0], 1024)
            for name, shape, dt in (
                ("_x", (cap, self.dim), np.float32),
                ("_ids", (cap,), np.int64),
                ("_sq", (cap,), np.float32),
            ):
                new = np.empty(shape, dt)
                new[:n] = getattr(self, name)[:n]
                setattr(self, name, new)
        self._x[n : n + m] = x
        self._ids[n : n + m] = ids
        self._sq[n : n + m] = (x * x).sum(1)
        self._n = n + m  # publish last: concurrent searches see old or new rows, never partial

    def _remove(self, ids: np.ndarray) -> None:
        n = self._n
        keep = ~np.isin(self._ids[:n], ids)
        self._x, self._ids, self._sq = self._x[:n][keep], self._ids[:n][keep], self._sq[:n][keep]
        self._n = int(keep.sum())

    def vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 (n,), stored vectors float32 (n, dim)); unit rows under "cosine"."""
        n = self._n
        return self._ids[:n].copy(), self._x[:n].copy()

    def _search(self, q: np.ndarray, k: int, **params: Any) -> SearchResult:
        n = self._n
        x, ids, sq = self._x[:n], self._ids[:n], self._sq[:n]
        q = self._prep(q)
        hib = self.metric != "l2"
        out_i = np.empty((q.shape[0], k), np.int64)
        out_s = np.empty((q.shape[0], k), np.float32)
        step = max(1, _BLOCK_ELEMENTS // max(n, 1))
        for s in range(0, q.shape[0], step):
            sc = exact_scores(q[s : s + step], x, self.metric, sq)
            out_i[s : s + step], out_s[s : s + step] = topk_from_scores(sc, k, hib, ids)
        out_s[out_i < 0] = pad_score(self.metric)
        return SearchResult(out_i, out_s)

    def _get_state(self):
        n = self._n
        return {}, {"x": self._x[:n], "ids": self._ids[:n]}

    def _set_state(self, meta, arrays):
        self._x = np.array(arrays["x"], dtype=np.float32)
        self._ids = np.array(arrays["ids"], dtype=np.int64)
        self._sq = (self._x * self._x).sum(1)
        self._n = self._x.shape[0]
