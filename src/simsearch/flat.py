"""Exact search: the baseline, and the oracle every test checks against."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._exact import exact_scores, exact_topk, topk_from_scores
from .index import Index, SearchResult, check_restored, normalize_rows, register
from .planner import FilterPlanner

__all__ = ["FlatIndex", "exact_scores", "topk_from_scores"]


@register("flat")
class FlatIndex(FilterPlanner, Index):
    """Exact search by brute force over every stored vector (numpy BLAS, blocked).

    Metrics "ip" (inner product), "cosine" (vectors normalized on add) and "l2" (squared
    distance). Supports remove(). Searches may run concurrently; writes are serialized.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> idx = ss.FlatIndex(16, "l2")
    >>> idx.add(x[:3]).tolist()
    [0, 1, 2]
    >>> idx.search(x[1], k=2).ids.tolist()   # exact: the item itself first
    [[1, 0]]
    """

    def __init__(self, dim: int, metric: str = "l2"):
        super().__init__(dim, metric)
        self._x = np.empty((0, dim), np.float32)
        self._ids = np.empty(0, np.int64)
        self._sq = np.empty(0, np.float32)
        self._publish(0)

    def _publish(self, n: int) -> None:
        """Make the first n rows the searched ones, as one tuple of views: a concurrent search
        reads old or new rows, never a mix, and a search slices nothing."""
        self._n = n
        self._live = (self._x[:n], self._ids[:n], self._sq[:n])

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
        self._publish(n + m)  # last: concurrent searches see old or new rows, never partial

    def _remove(self, ids: np.ndarray) -> None:
        n = self._n
        keep = ~np.isin(self._ids[:n], ids)
        self._x, self._ids, self._sq = self._x[:n][keep], self._ids[:n][keep], self._sq[:n][keep]
        self._publish(int(keep.sum()))

    def vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 (n,), stored vectors float32 (n, dim)); unit rows under "cosine"."""
        n = self._n
        return self._ids[:n].copy(), self._x[:n].copy()

    def _search(self, q: np.ndarray, k: int, **params: Any) -> SearchResult:
        x, ids, sq = self._live
        return SearchResult(*exact_topk(self._prep(q), x, ids, k, self.metric, sq))

    def _exact_under(self, params: dict) -> bool:
        return True

    def _stored(self) -> tuple[np.ndarray, np.ndarray]:
        n = self._n
        return self._ids[:n], self._x[:n]

    def _get_state(self):
        n = self._n
        return {}, {"x": self._x[:n], "ids": self._ids[:n]}

    def _set_state(self, meta, arrays):
        self._x = np.array(arrays["x"], dtype=np.float32)
        self._ids = np.array(arrays["ids"], dtype=np.int64)
        check_restored(self._idset.sorted, self._ids, self._x, self.dim)
        self._sq = (self._x * self._x).sum(1)
        self._publish(self._x.shape[0])
