"""What a PyramidIndex is composed of (docs/cluster.md, "The router"): parts, each searched by
the one search signature, and a fan-out strategy that asks them. A composite over any index,
as faiss's ``IndexShards`` is: whether a part is in this process or on a shard server is the
part's business.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from ..index import SearchResult


class Part(Protocol):
    """One part of a PyramidIndex: an Index (held and written by the index), or a cluster's
    part on its shard replicas (written by the coordinator's replication, which plans on the
    index and installs what committed: ``PyramidIndex.draft``)."""

    def search(self, q: Any, k: int, *, allow: Any = None, deny: Any = None,
               where: dict | None = None, deadline: float | None = None,
               **params: Any) -> SearchResult: ...
    def add(self, x: Any, ids: Any = None) -> np.ndarray: ...
    def remove(self, ids: Any) -> int: ...
    def get_vectors(self, ids: Any) -> np.ndarray: ...
    def __len__(self) -> int: ...


#: one part's share of a search: (the part, its queries, their parameters and filter)
PartJob = tuple[Part, np.ndarray, dict]

#: Runs ``[(part, queries, params)]`` by ``deadline`` with k each: per job, its SearchResult,
#: or the exception of a part that could not answer (``require_complete`` decides).
Fanout = Callable[[Sequence[PartJob], int, "float | None"], list]


def in_turn(jobs: Sequence[PartJob], k: int, deadline: float | None = None) -> list:
    """The fan-out of parts in this process: one after the other (each may use threads)."""
    return [part.search(q, k, deadline=deadline, **params) for part, q, params in jobs]
