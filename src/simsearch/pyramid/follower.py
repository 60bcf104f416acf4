"""Follower coordinators (design §6: coordinators, any number).

The leader coordinator owns each collection's router (centres, meta-HNSW, partition, id -> part,
MIPS lists) in its store and is the single writer of it and of the cluster map. A follower serves
the same gRPC API: it searches with a copy of the leader's router, asking the shard servers
itself, and forwards every write and admin call to the leader. Reads therefore scale with the
number of coordinators and keep working while the leader is down; writes need the leader.

Freshness: routing only uses the trained model (centres, meta-HNSW, partition), which never
changes once trained, so a follower's answers are the leader's whatever the age of its copy. The
copy is re-fetched when the leader's collection changes (training, or its item count: the count
decides the empty-index and small-index cases), at most once per ``refresh_interval`` seconds and
in the background. Only while the copy is untrained or empty does a search check the leader
first, so a follower never answers "not trained" or "nothing" for long after the leader changed.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from ..index import SearchResult
from .datapath import DEADLINE, ShardPool, load_router

log = logging.getLogger(__name__)

SYNC_CHECK_INTERVAL = 0.1  # s between the leader checks of an empty or untrained copy


class FollowerCollection:
    """One collection as a follower sees it: local routed reads, writes forwarded."""

    def __init__(self, store: FollowerStore, name: str):
        self.store, self.name = store, name
        self._remote = store.leader.collection(name)  # CollectionNotFoundError if absent
        d = self._remote.describe()
        self.config = {k: d[k] for k in ("dim", "metric", "kind", "params")}
        self._router = None
        self._state: tuple | None = None  # (trained, count) the copy was taken at
        self._checked = 0.0
        self._lock = threading.Lock()
        self._refreshing = False

    # -- the router copy --------------------------------------------------------------------

    def _fetch(self) -> None:
        d = self._remote.describe()
        state = (d["trained"], d["count"])
        if state == self._state and self._router is not None:
            return
        _config, data = self.store.leader.export_collection(self.name)
        self._router, self._state = load_router(data, self.store.pool), state

    def _refresh_in_background(self) -> None:
        from ..service.errors import CollectionNotFoundError

        try:
            self._fetch()
        except CollectionNotFoundError:  # dropped through another coordinator
            self.store.forget(self.name)
        except Exception as exc:  # the leader is down or busy: keep serving the copy we have
            log.warning("%s: could not refresh the router from the leader: %s", self.name, exc)
        finally:
            self._refreshing = False

    def router(self):
        now = time.monotonic()
        with self._lock:
            r = self._router
            if r is None or ((not r.is_trained or len(r) == 0)
                             and now - self._checked >= SYNC_CHECK_INTERVAL):
                # an empty or untrained copy would answer "nothing" or "not trained" for a
                # whole refresh interval after the leader's first training or writes: while
                # it is, ask the leader before answering (a describe call; cheap)
                self._fetch()
                self._checked = now
            elif now - self._checked >= self.store.refresh_interval and not self._refreshing:
                self._checked, self._refreshing = now, True
                threading.Thread(target=self._refresh_in_background, daemon=True).start()
            return self._router

    def invalidate(self) -> None:
        with self._lock:
            self._router, self._state = None, None

    # -- the store collection surface (what the servicer calls) -----------------------------

    def describe(self) -> dict[str, Any]:
        return self._remote.describe()

    def search(self, q: Any, k: int, params: dict, deadline: float | None = None) -> SearchResult:
        token = DEADLINE.set(deadline)
        try:
            return self.router().search(q, k, **params)
        finally:
            DEADLINE.reset(token)

    def add(self, x, ids=None, upsert: bool = False, deadline: float | None = None):
        out = self._remote.add(x, ids, upsert=upsert)
        self._checked = float("-inf")  # this follower's own writes: the next search re-checks
        return out

    def remove(self, ids, deadline: float | None = None, missing_ok: bool = False) -> int:
        out = self._remote.remove(ids, missing_ok=missing_ok)
        self._checked = float("-inf")
        return out

    def train(self, x, deadline: float | None = None) -> None:
        self._remote.train(x)
        self.invalidate()

    def snapshot(self, deadline: float | None = None) -> int:
        return self._remote.snapshot()

    def export_bytes(self, deadline: float | None = None) -> bytes:
        return self.store.leader.export_collection(self.name)[1]

    def close(self) -> None:
        self._router = None


class FollowerStore:
    """The store surface of a follower coordinator: collections are the leader's."""

    def __init__(self, leader_address: str, pool: ShardPool, refresh_interval: float = 2.0,
                 token: str | None = None, tls_ca: str | None = None, timeout: float = 600.0):
        """``pool``: this follower's read-only shard pool, which the router copies search."""
        from ..service.client import connect

        self.leader = connect(leader_address, token=token, tls_ca=tls_ca, timeout=timeout)
        self.pool = pool
        self.refresh_interval = refresh_interval
        self._collections: dict[str, FollowerCollection] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> FollowerCollection:
        with self._lock:
            col = self._collections.get(name)
        if col is None:
            col = FollowerCollection(self, name)
            with self._lock:
                col = self._collections.setdefault(name, col)
        return col

    def forget(self, name: str) -> None:
        with self._lock:
            self._collections.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self.leader.list_collections())

    def create(self, name: str, dim: int, metric: str, kind: str, params: dict):
        self.leader.create_collection(name, dim, metric, kind, **params)
        return self.get(name)

    def drop(self, name: str) -> None:
        self.leader.drop_collection(name)
        self.forget(name)

    def import_collection(self, name: str, config: dict, data: bytes):
        self.leader.import_collection(name, config, data)
        self.forget(name)
        return self.get(name)

    def close(self) -> None:
        self.leader.close()
