"""The one client interface (docs/service.md, "One API"): what ``simsearch.connect`` returns for
every form of address, a node's or a cluster's client (``client.Client``) or this process's
(``embedded.EmbeddedClient``), declared once, as qdrant-client's ``QdrantBase`` is. mypy checks
that both implement it (tests/static/protocols.py); the asyncio client (``aio.AsyncClient``)
has the same calls as coroutines."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..index import SearchResult


class CollectionAPI(Protocol):
    """A collection: the Index contract's surface, attributes, ``get`` and ``snapshot``.

    >>> import simsearch as ss
    >>> def nearest(col: ss.CollectionAPI, q) -> int:    # any client's collection
    ...     return int(col.search(q, 1).ids[0, 0])
    >>> with ss.connect(":memory:") as c:
    ...     col = c.create_collection("a", 2, "l2")
    ...     _ = col.add([[0.0, 0.0], [5.0, 5.0]])
    ...     nearest(col, [4.0, 4.0])
    1
    """

    name: str
    dim: int
    metric: str
    kind: str

    def describe(self) -> dict[str, Any]: ...
    def __len__(self) -> int: ...
    @property
    def is_trained(self) -> bool: ...
    def train(self, x: Any = None, encoder: Any = None, **fit_params: Any) -> None: ...
    def add(self, x: Any, ids: Any = None, upsert: bool = False,
            attributes: dict[str, Any] | None = None) -> np.ndarray: ...
    def search(self, q: Any, k: int, *, allow: Any = None, deny: Any = None,
               where: dict | None = None, deadline: float | None = None,
               **params: Any) -> SearchResult: ...
    def get(self, ids: Any = None, vectors: bool = False,
            where: dict | None = None) -> dict[str, Any]: ...
    def remove(self, ids: Any, missing_ok: bool = False) -> int: ...
    def snapshot(self) -> int: ...


class ClientAPI(Protocol):
    """The collections of a node, a cluster or this process.

    >>> import simsearch as ss
    >>> def items(client: ss.ClientAPI) -> int:           # embedded, a node or a cluster
    ...     return sum(len(client.collection(n)) for n in client.list_collections())
    >>> with ss.connect(":memory:") as c:
    ...     _ = c.create_collection("a", 2, "l2").add([[1.0, 0.0], [0.0, 1.0]])
    ...     items(c)
    2
    """

    address: Any

    def close(self) -> None: ...
    def __enter__(self) -> ClientAPI: ...
    def __exit__(self, *exc: Any) -> None: ...
    def server_info(self) -> dict[str, Any]: ...
    def health(self, service: str = "") -> str: ...
    def create_collection(self, name: str, dim: int, metric: str = "l2", kind: str = "flat",
                          schema: dict[str, str] | None = None,
                          **build_params: Any) -> CollectionAPI: ...
    def collection(self, name: str) -> CollectionAPI: ...
    def drop_collection(self, name: str) -> None: ...
    def list_collections(self) -> list[str]: ...
    def export_collection(self, name: str) -> tuple[dict[str, Any], bytes]: ...
    def import_collection(self, name: str, config: dict[str, Any],
                          data: bytes) -> CollectionAPI: ...
