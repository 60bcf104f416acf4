"""The cluster's state in etcd (docs/cluster.md, "Control plane"): a watched, cached view for
every process, and the leader's fenced changes.

Keys, relative to ``/simsearch/<cluster>/``:

    config                  {"replicas": R}                      put once
    next_shard_id           N                                    shard ids are allocated here
    shards/<id>             {"id", "address", "pid"}             under the shard's lease
    coordinators/<address>  {"address", "pid"}                   under the coordinator's lease
    leader                  the leader's address                 the election (election.py)
    draining/<id>           "1"                                  `cluster drain` asks
    retired/<id>            "1"                                  the leader: drained, may stop
    collections/<name>      {"dim", "metric", "kind", "params"}  the leader
    map/<name>              {"epoch", "parts": {part: {"replicas": [...], "in_sync": [...]}}}
    router/<name>           {"seq", "blob", "sha256", "size", "holders": [...]}
    log/<name>/<seq>        one write's router decisions          the leader

Every change the leader makes is one transaction conditioned on the election (``fence()``) and
on the revision of the keys it read, so a deposed leader changes nothing.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..._durable import atomic_write
from ...errors import SimsearchError
from .errors import CoordinationError
from .etcd import Compare, Etcd, WatchEvent

log = logging.getLogger(__name__)

WATCHED = ("config", "leader", "shards/", "draining/", "retired/", "collections/", "map/",
           "router/", "coordinators/")


def shard_id(etcd: Etcd, data_dir: Path, reuse: int | None = None) -> int:
    """This data directory's shard id: allocated once from etcd's counter, then kept on disk.
    ``reuse``: the id of a shard whose disk was lost (its replicas are re-copied onto it)."""
    path = data_dir / "shard_id"
    if path.exists():
        return int(path.read_text())
    sid = reuse
    while sid is None:
        value, rev = etcd.get("next_shard_id")
        n = int(value) if value else 0
        if etcd.cas([Compare.mod("next_shard_id", rev)], {"next_shard_id": str(n + 1)}):
            sid = n
    data_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(str(sid).encode()))
    return sid


class MapConflictError(SimsearchError):
    """A fenced change kept losing to concurrent changes."""


def _json(value: bytes | None) -> Any:
    return None if value is None else json.loads(value.decode())


class ClusterState:
    """A cache of the cluster's keys, kept current by watches, with change callbacks.

    ``listeners`` are called as ``fn(key)`` after a watched key changed (from the watch thread;
    keep them short)."""

    def __init__(self, etcd: Etcd):
        self.etcd = etcd
        self._lock = threading.RLock()
        self._kv: dict[str, tuple[Any, int]] = {}  # relative key -> (decoded value, mod_rev)
        self.listeners: list[Callable[[str], None]] = []
        self._loaded = threading.Event()
        self._cancels = []
        for sub in WATCHED:  # the watch lists the prefix first, then streams changes
            self._cancels.append(etcd.watch_prefix(sub, self._on_events))
        # a first listing so callers see a complete view before the watches deliver
        for sub in WATCHED:
            for key, (value, rev) in etcd.get_prefix(sub).items():
                self._store(key, value, rev)
        self._loaded.set()

    def close(self) -> None:
        for cancel in self._cancels:
            cancel()

    # -- cache ------------------------------------------------------------------------------

    def _store(self, key: str, value: bytes | None, rev: int) -> bool:
        with self._lock:
            old = self._kv.get(key)
            if value is None:
                if old is None or (rev and old[1] > rev):  # a late event: newer value cached
                    return False
                del self._kv[key]
                return True
            if old is not None and old[1] >= rev:
                return False
            try:
                self._kv[key] = (_json(value), rev)
            except ValueError:  # the leader key holds a bare address
                self._kv[key] = (value.decode(errors="replace"), rev)
            return True

    def _on_events(self, events: list[WatchEvent]) -> None:
        changed = []
        for ev in events:
            if self._store(ev.key, ev.value if ev.kind == "put" else None, ev.mod_revision):
                changed.append(ev.key)
        for key in changed:
            for fn in list(self.listeners):
                try:
                    fn(key)
                except Exception:
                    log.exception("cluster state listener failed on %s", key)

    def get(self, key: str) -> tuple[Any, int]:
        """``(value, mod_revision)`` from the cache; ``(None, 0)`` if absent."""
        with self._lock:
            return self._kv.get(key, (None, 0))

    def under(self, sub: str) -> dict[str, Any]:
        with self._lock:
            return {k[len(sub):]: v for k, (v, _) in self._kv.items() if k.startswith(sub)}

    def refresh(self, key: str) -> tuple[Any, int]:
        """Read ``key`` from etcd now (not the cache) and cache it."""
        value, rev = self.etcd.get(key)
        with self._lock:
            self._kv.pop(key, None)
        self._store(key, value, rev)
        return self.get(key)

    # -- views ------------------------------------------------------------------------------

    @property
    def replicas(self) -> int:
        cfg, _ = self.get("config")
        return int((cfg or {}).get("replicas", 2))

    def shards(self) -> dict[int, dict]:
        """Registered (live) shards: id -> {"id", "address", "pid"}."""
        return {int(k): v for k, v in self.under("shards/").items()}

    def draining(self) -> set[int]:
        return {int(k) for k in self.under("draining/")}

    def retired(self) -> set[int]:
        return {int(k) for k in self.under("retired/")}

    def collections(self) -> dict[str, dict]:
        return self.under("collections/")

    def part_map(self, name: str) -> dict:
        """``{"epoch", "parts": {part: {"replicas", "in_sync"}}}`` of a collection ({} if none)."""
        m, _ = self.get(f"map/{name}")
        return m or {}

    def part_entry(self, part: str) -> dict:
        name = part.rsplit(".p", 1)[0]
        return self.part_map(name).get("parts", {}).get(part, {"replicas": [], "in_sync": []})

    def all_parts(self) -> dict[str, list[int]]:
        """Every part of every collection -> its replica shards."""
        out = {}
        for m in self.under("map/").values():
            for part, e in (m or {}).get("parts", {}).items():
                out[part] = list(e["replicas"])
        return out

    # -- fenced changes (the leader) --------------------------------------------------------

    def change(self, fence: Callable[[], list[Compare]], keys: list[str],
               fn: Callable[..., tuple[dict, list] | None], attempts: int = 20) -> bool:
        """Read ``keys`` from etcd, call ``fn(*values)`` -> ``(puts, deletes)`` (values decoded,
        None if absent; puts are encoded to JSON) or None for "nothing to do", and apply it in
        one transaction conditioned on ``fence()`` and on every key's revision. Retries on a
        conflict; True if applied, False if ``fn`` declined. ``NotLeaderError`` if fenced out."""
        for _ in range(attempts):
            read = [self.etcd.get(k) for k in keys]
            out = fn(*[_json(v) for v, _ in read])
            if out is None:
                return False
            puts, deletes = out
            compares = [*fence(), *[Compare.mod(k, rev) for k, (_, rev) in zip(keys, read,
                                                                                 strict=True)]]
            enc = {k: v if isinstance(v, (bytes, str)) else json.dumps(v) for k, v in puts.items()}
            try:
                if self.etcd.cas(compares, enc, deletes):
                    for k in keys:
                        self.refresh(k)
                    return True
            except CoordinationError:
                # the outcome is unknown: re-read and decide again (fn must be idempotent)
                log.warning("a cluster-state change to %s failed in transit; re-reading", keys)
            fence()  # raises NotLeaderError once we are not leader
        raise MapConflictError(f"could not change {keys} after {attempts} attempts")

    def update_part(self, fence, part: str, fn: Callable[[dict], dict | None]) -> bool:
        """Change one part's entry (``fn(entry) -> new entry``, or None: no change); epoch + 1."""
        name = part.rsplit(".p", 1)[0]
        key = f"map/{name}"

        def edit(m):
            if m is None or part not in m.get("parts", {}):
                return None
            entry = fn(dict(m["parts"][part]))
            if entry is None or entry == m["parts"][part]:
                return None
            m["parts"][part] = entry
            m["epoch"] = int(m.get("epoch", 0)) + 1
            return {key: m}, []

        return self.change(fence, [key], edit)
