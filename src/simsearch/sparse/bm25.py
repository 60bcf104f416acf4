"""BM25 computed exactly as an inner product (docs/sparse.md, "BM25"): an item is a row of token
counts, a query the counts of its tokens, and the index weighs both at query time with the
statistics of what it holds then (the Lucene variant, which bm25s and Lucene score).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidParameterError
from ..index import SearchResult, register
from .batch import SparseBatch, sparse_batch
from .flat import SparseStore

#: the largest vocabulary a BM25 index keeps document frequencies for (an int32 a term)
MAX_VOCABULARY = 1 << 26


def count_tokens(docs: Sequence[Sequence[int]], dim: int) -> SparseBatch:
    """Rows of token counts (BM25's items and queries) from token-id lists, e.g. what
    ``bm25s.tokenize(...).ids`` gives."""
    pairs = []
    for tokens in docs:
        t, c = np.unique(np.asarray(tokens, np.int64), return_counts=True)
        pairs.append((t, c.astype(np.float32)))
    return sparse_batch(pairs, dim, "token counts")


@register("bm25")
class BM25Index(SparseStore):
    """Exact BM25 top-k: score(q, d) = sum over the query's tokens t (a token repeated in the
    query counts as often) of idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)), with
    idf(t) = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5)), tf the count of t in d, |d| the sum of
    d's counts, and N, df and avgdl those of the items held at the time of the query: every
    answer is exact after any adds and removes (the statistics are never frozen). Items and
    queries are rows of token counts (``count_tokens``); ``dim`` is the vocabulary size (at
    most 2^26). An item sharing no token with the query is not returned.

    >>> import simsearch as ss
    >>> from simsearch.sparse import BM25Index, count_tokens
    >>> docs = [[0, 1, 1], [1, 2], [3]]                 # token ids of three documents
    >>> idx = BM25Index(4)
    >>> idx.add(count_tokens(docs, 4)).tolist()
    [0, 1, 2]
    >>> idx.search(count_tokens([[1]], 4), k=3).ids.tolist()   # doc 0 says token 1 twice
    [[0, 1, -1]]
    """

    def __init__(self, dim: int, metric: str = "ip", k1: float = 1.5, b: float = 0.75):
        for name, v, hi in (("k1", k1, 100.0), ("b", b, 1.0)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
                raise InvalidParameterError(f"{name} must be a number in [0, {hi:g}]; got {v!r}")
        if isinstance(dim, int) and dim > MAX_VOCABULARY:
            raise InvalidParameterError(f"dim (the vocabulary) must be at most {MAX_VOCABULARY} "
                                        f"for bm25; got {dim}")
        super().__init__(dim, metric, k1=float(k1), b=float(b))
        self.k1, self.b = float(k1), float(b)

    def _clear(self) -> None:
        super()._clear()
        self._df = np.zeros(self.dim, np.int32)  # items holding each token

    def _add(self, x: SparseBatch, ids: np.ndarray) -> None:
        super()._add(x, ids)
        np.add.at(self._df, x.indices, 1)

    def _remove(self, ids: np.ndarray) -> None:
        np.subtract.at(self._df, self._rows(self._positions(ids)).indices, 1)
        super()._remove(ids)

    def _set_state(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        super()._set_state(meta, arrays)
        self._df = np.zeros(self.dim, np.int32)
        np.add.at(self._df, self._rows(np.flatnonzero(self._alive)).indices, 1)

    def idf(self, terms: Any) -> np.ndarray:
        """idf of each term id, by what the index holds now (float32)."""
        n = len(self)
        df = self._df[np.asarray(terms, np.int64)].astype(np.float64)
        return np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)

    def avgdl(self) -> float:
        """The mean length (token count) of the items held."""
        # summed over the held rows in position order each time: the same value however the
        # index came to hold them (a running total would differ in its last bits after a load)
        return float(self._rowsum[self._alive].sum(dtype=np.float64)) / max(len(self), 1) \
            or 1.0

    def encode_documents(self, x: Any) -> SparseBatch:
        """Rows of token counts as BM25 document vectors, tf / (tf + k1 * (1 - b + b * |d| /
        avgdl)) by the statistics held now: their inner product with ``encode_queries`` is the
        BM25 score, for any inner-product index (e.g. SeismicIndex over BM25)."""
        x = sparse_batch(x, self.dim, "token counts", nonnegative=True, allow_empty_rows=True)
        total = np.concatenate([[0.0], np.cumsum(x.values, dtype=np.float64)])
        start = x.indptr - x.indptr[0]
        dl = np.repeat(total[start[1:]] - total[start[:-1]], np.diff(x.indptr)).astype(
            np.float32)
        norm = self.k1 * (1 - self.b + self.b * dl / np.float32(self.avgdl()))
        return SparseBatch(x.indptr, x.indices, (x.values / (x.values + norm)).astype(
            np.float32), x.dim)

    def encode_queries(self, q: Any) -> SparseBatch:
        """Rows of token counts as BM25 query vectors: each count times its token's idf."""
        q = sparse_batch(q, self.dim, "token counts", nonnegative=True, allow_empty_rows=True)
        return SparseBatch(q.indptr, q.indices,
                           (q.values * self.idf(q.indices)).astype(np.float32), q.dim)

    def _scan(self, q: SparseBatch, k: int, ok: np.ndarray) -> SearchResult:
        return self._exact(self.encode_queries(q), k, ok, self._rowsum,
                           (np.float32(self.k1), np.float32(self.b), np.float32(self.avgdl())))
