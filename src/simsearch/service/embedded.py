"""Embedded mode: a node's collections in this process, without gRPC (docs/service.md,
"Embedded mode"). The same calls as a client of a node or a cluster; moving between them is a
change of ``connect``'s argument::

    c = simsearch.connect(":memory:")          # in process; gone when closed
    c = simsearch.connect(path="./data")       # in process, durable (a node's data directory)
    c = simsearch.connect("localhost:50051")   # a node, or a cluster's coordinators

A path holds exactly what ``simsearch serve --data-dir`` keeps, so a directory written here can
be served by a node later, and the other way round (never both at once).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..index import SearchResult, as_id_array, index_kinds
from .attributes import check_where
from .dirlock import DirectoryLock
from .errors import DataDirLockedError
from .store import Store

__all__ = ["EmbeddedClient", "EmbeddedCollection"]


MEMORY_PREFIX = "simsearch-memory-"


def _memory_dir() -> str:
    """A private directory for ":memory:" in the system's temporary directory (not /dev/shm:
    a container's shm is 64 MiB by default). The directories of processes that ended without
    closing theirs (SIGKILL, SIGTERM) are removed here first: their lock is gone with them."""
    base = Path(tempfile.gettempdir())
    for stale in base.glob(MEMORY_PREFIX + "*"):
        try:
            DirectoryLock(stale).release()  # free: its owner is gone
        except (DataDirLockedError, OSError):
            continue
        shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=MEMORY_PREFIX, dir=base)


class EmbeddedClient:
    """The collections of one data directory (``path``), or of a private one deleted on
    ``close`` (``path=None``: ":memory:"). Thread-safe, like a node; one per directory.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> client = ss.connect(":memory:")             # or ss.connect(path="./data"): durable
    >>> col = client.create_collection("docs", 16, "l2", "hnsw")
    >>> _ = col.add(x[:50], attributes={"colour": ["red", "blue"] * 25})
    >>> col.search(x[1], k=1, where={"colour": "blue"}).ids.tolist()
    [[1]]
    >>> client.close()
    """

    def __init__(self, path: str | os.PathLike | None = None):
        if path is not None and str(path) == ":memory:":
            path = None  # connect(path=":memory:") means memory, not a folder named so
        self._scratch = _memory_dir() if path is None else None
        self.address = ":memory:" if path is None else str(path)
        self.store = Store(self._scratch or Path(path), durable=path is not None)
        self._closed = False

    def __repr__(self) -> str:
        return f"EmbeddedClient({self.address!r})"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.store.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> EmbeddedClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_scratch", None) is not None and not getattr(self, "_closed", True):
            shutil.rmtree(self._scratch, ignore_errors=True)

    def server_info(self) -> dict[str, Any]:
        return {"version": __version__, "max_message_bytes": 0, "index_kinds": index_kinds()}

    def health(self, service: str = "") -> str:
        return "SERVING"

    def create_collection(self, name: str, dim: int, metric: str = "l2", kind: str = "flat",
                          schema: dict[str, str] | None = None,
                          **build_params: Any) -> EmbeddedCollection:
        """As ``Client.create_collection``: an index of ``kind``, ``schema`` declaring
        attribute types (docs/filters.md)."""
        return EmbeddedCollection(self.store.create(name, dim, metric, kind, build_params,
                                                    schema=schema), self)

    def collection(self, name: str) -> EmbeddedCollection:
        return EmbeddedCollection(self.store.get(name), self)

    def drop_collection(self, name: str) -> None:
        self.store.drop(name)

    def list_collections(self) -> list[str]:
        return self.store.names()

    def export_collection(self, name: str) -> tuple[dict[str, Any], bytes]:
        return self.store.get(name).export()

    def import_collection(self, name: str, config: dict[str, Any],
                          data: bytes) -> EmbeddedCollection:
        return EmbeddedCollection(self.store.import_collection(name, config, data), self)


class EmbeddedCollection:
    """One collection, with the surface of ``RemoteCollection``.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> with ss.connect(":memory:") as client:
    ...     col = client.create_collection("docs", 16, "cosine", "flat")
    ...     _ = col.add(x[:5])
    ...     n, got = len(col), col.get([4, 9])["ids"].tolist()
    >>> n, got
    (5, [4])
    """

    def __init__(self, served, client: EmbeddedClient):
        # the handle keeps its client (and so an in-memory store) alive, as a node's does
        self._client = client
        c = served.config
        self.name, self.dim, self.metric, self.kind = served.name, c["dim"], c["metric"], c["kind"]
        d = served.describe()
        self.search_params = frozenset(d["search_params"])
        self.needs_training = bool(d["needs_training"])

    @property
    def _col(self):
        """The collection of this name now, as a node's handle finds it by name on every call:
        once dropped, CollectionNotFoundError."""
        return self._client.store.get(self.name)

    def __repr__(self) -> str:
        return (f"EmbeddedCollection({self.name!r}, kind={self.kind!r}, dim={self.dim}, "
                f"metric={self.metric!r})")

    def describe(self) -> dict[str, Any]:
        return self._col.describe()

    def __len__(self) -> int:
        return int(self._col.describe()["count"])

    @property
    def is_trained(self) -> bool:
        return bool(self._col.describe()["trained"])

    def train(self, x: Any = None, encoder: Any = None, **fit_params: Any) -> None:
        if encoder is not None:  # a string index's trained encoder
            fit_params["encoder_file"] = encoder if isinstance(encoder, bytes) else \
                encoder.to_bytes()
        self._col.train(x, **fit_params)

    def add(self, x: Any, ids: Any = None, upsert: bool = False,
            attributes: dict[str, Any] | None = None) -> np.ndarray:
        return self._col.add(x, ids, upsert=upsert, attributes=attributes)

    def search(self, q: Any, k: int, *, allow: Any = None, deny: Any = None,
               where: dict | None = None, deadline: float | None = None,
               **params: Any) -> SearchResult:
        if where is not None:
            check_where(where)
        return self._col.search(q, k, allow=allow, deny=deny, where=where, deadline=deadline,
                                **params)

    def get(self, ids: Any = None, vectors: bool = False,
            where: dict | None = None) -> dict[str, Any]:
        """As ``RemoteCollection.get``."""
        if where is not None:
            check_where(where)
        got = self._col.get(ids, vectors=vectors, where=where)
        del got["next"]  # one page: no message limit in process
        return got

    def remove(self, ids: Any, missing_ok: bool = False) -> int:
        return self._col.remove(as_id_array(ids), missing_ok=missing_ok)

    def snapshot(self) -> int:
        return self._col.snapshot()
