"""What a search answers (``SearchResult``, padded as every index pads) and the one search
signature everything index-like has (``Searchable``): docs/architecture.md, "Results"."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ._validate import higher_is_better


@dataclass(slots=True)
class SearchResult:
    """Top-k answers, best first. ``ids`` int64 (nq, k), -1 where fewer than k results exist.
    ``scores`` float32 (nq, k): inner product ("ip"), cosine similarity ("cosine") or squared L2
    distance ("l2"); padding is -inf for similarities and +inf for "l2". ``coverage``: the
    fraction of the data that answered (below 1.0 only from a cluster that returned a partial
    result, docs/cluster.md). ``stats``: the batch's work counters, summed over its queries, where
    the index counts them (ip-NSW+: distance computations; the LSH indexes: probed items and
    buckets), else None.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> idx = ss.FlatIndex(16, "l2")
    >>> _ = idx.add(x[:2])
    >>> ids, scores = idx.search(x[:1], k=3)   # unpacks; -1 and +inf pad past the 2 items
    >>> ids.tolist(), bool(np.isinf(scores[0, 2]))
    ([[0, 1, -1]], True)
    """

    ids: np.ndarray
    scores: np.ndarray
    coverage: float = 1.0
    stats: dict | None = None

    def __iter__(self) -> Iterator[np.ndarray]:  # allows `ids, scores = idx.search(...)`
        yield self.ids
        yield self.scores


class Searchable(Protocol):
    """What is index-like, whatever holds the data: an Index, a collection in process, on a
    node or on a cluster (embedded, RemoteCollection, a cluster's), a cluster's RemotePart.
    One search signature for all of them."""

    def search(self, q: Any, k: int, *, allow: Any = None, deny: Any = None,
               where: dict | None = None, deadline: float | None = None,
               **params: Any) -> SearchResult: ...
    def __len__(self) -> int: ...


def pad_score(metric: str) -> float:
    return -np.inf if higher_is_better(metric) else np.inf


def empty_result(nq: int, k: int, metric: str) -> SearchResult:
    return SearchResult(
        np.full((nq, k), -1, dtype=np.int64), np.full((nq, k), pad_score(metric), np.float32)
    )


def pad_result(r: SearchResult, k: int, metric: str) -> SearchResult:
    """Widen a (nq, kk) result to (nq, k) with padding; the padding is all it costs."""
    nq, kk = r.ids.shape
    if kk >= k:
        return r
    out = empty_result(nq, k, metric)
    out.ids[:, :kk] = r.ids
    out.scores[:, :kk] = r.scores
    return out
