"""The leader's placement duties (docs/cluster.md, "Rebalancing"): where a collection's part
replicas and router checkpoints go, replica moves onto new shards and off draining or lost
ones, and retiring drained shards. A Rebalancer is composed into the Coordinator, which hands
it what it acts through; the decisions themselves are the pure functions of
control/placement.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .checkpoints import copy_model
from .control.placement import next_move, place

log = logging.getLogger(__name__)


class Rebalancer:
    """The leader's placement duties (module docstring), acting through the cluster ``state``,
    the shard ``pool``, the leader's ``fence()`` and ``term()``, the collections' ``names()``
    and ``get(name)``; a shard gone longer than ``replace_after`` seconds has its replicas
    remade; ``wake`` is set to take the next step at once."""

    def __init__(self, state, pool, fence: Callable[[], object], term: Callable[[], int],
                 names: Callable[[], list[str]], get: Callable[[str], Any],
                 replace_after: float, wake: threading.Event):
        self.state, self.pool, self.fence, self.term = state, pool, fence, term
        self.names, self.get = names, get
        self.replace_after = replace_after
        self._wake = wake
        self._since_unregistered: dict[int, float] = {}

    def active_shards(self) -> list[int]:
        draining, retired = self.state.draining(), self.state.retired()
        return sorted(s for s in self.state.shards() if s not in draining | retired)

    def shard_lost(self, sid: int) -> bool:
        """Shard ``sid`` is gone for good: retired, or unregistered for longer than
        ``replace_after`` (its replicas are being remade elsewhere)."""
        if sid in self.state.retired():
            return True
        if sid in self.state.shards():
            return False
        since = self._since_unregistered.setdefault(sid, time.monotonic())
        return time.monotonic() - since > self.replace_after

    def checkpoint_holders(self) -> list[int]:
        """Where router checkpoints go: up to three live shards (replication beyond one)."""
        live = [s for s in self.active_shards() if self.pool.up.get(s)] or self.active_shards()
        return live[: max(3, self.state.replicas)]

    def place_collection(self, name: str, n_parts: int) -> None:
        """Give a collection's parts their replicas (once, before training)."""
        parts = [f"{name}.p{j}" for j in range(n_parts)]

        def edit(m):
            if m and set(m.get("parts", {})) == set(parts):
                return None
            others = {p: r for p, r in self.state.all_parts().items()
                      if not p.startswith(f"{name}.p")}
            cmap = place(parts, self.state.replicas, self.active_shards(), others)
            entry = {p: {"replicas": r, "in_sync": list(r)} for p, r in cmap.items()}
            return {f"map/{name}": {"epoch": int((m or {}).get("epoch", 0)) + 1,
                                    "parts": entry}}, []

        self.state.change(self.fence, [f"map/{name}"], edit)

    def step(self) -> None:
        """One pass: remake lost replicas, move one replica, retire drained shards."""
        now = time.monotonic()
        registered = self.state.shards()
        cmap = self.state.all_parts()
        for sids in cmap.values():
            for s in sids:
                if s not in registered:
                    self._since_unregistered.setdefault(s, now)
        for s in list(self._since_unregistered):
            if s in registered:
                del self._since_unregistered[s]
        gone = {s for s, t in self._since_unregistered.items() if now - t > self.replace_after}
        draining = self.state.draining() | gone
        active = [s for s in self.active_shards() if self.pool.up.get(s)]
        for sid in self.pool.stale_replicas() & set(active):  # retry catch-ups that failed
            self.pool.recover(sid)
        move = next_move(cmap, active, draining)
        if move is not None:
            if self._move(move):
                self._wake.set()  # the next move at once (one that cannot be made waits)
            return
        for s in self.state.draining():  # drained: tell it to stop
            if any(s in r for r in cmap.values()) or s in self.state.retired():
                continue
            if self._checkpoints_moved_off(s):  # never retire the last copy of a router
                self.state.change(self.fence, [f"retired/{s}"],
                                  lambda v, s=s: None if v else ({f"retired/{s}": "1"}, []))
                log.warning("shard %d drained and retired", s)

    def _checkpoints_moved_off(self, sid: int) -> bool:
        """Checkpoint again every router whose checkpoint shard ``sid`` holds (onto the shards
        that take checkpoints now, which a draining shard is not); True once none is left on
        it."""
        moved = True
        for name in self.names():
            meta = self.state.refresh(f"router/{name}")[0]
            if meta and sid in meta.get("holders", []):
                try:
                    self.get(name).move_checkpoint()
                    log.warning("%s: router checkpoint moved off draining shard %d", name, sid)
                except Exception as exc:
                    log.warning("%s: could not move the router checkpoint off shard %d: %s",
                                name, sid, exc)
                    moved = False
        return moved

    def _move(self, move) -> bool:
        """Copy a current part replica to its new shard under the part's write lock (writes
        to that part wait; searches go on), switch the map (reads and writes go to the new
        copy), then drop the old copy. False if it cannot be made yet."""
        name = move.part.rsplit(".p", 1)[0]
        self.get(name).current()  # the part objects exist once the router is loaded
        part = self.pool.parts.get(move.part)
        if part is None:
            log.warning("cannot move %s: its collection is not trained", move.part)
            return False
        t0 = time.monotonic()
        with part.write_lock:
            e = self.state.part_entry(move.part)
            sources = [s for s in e["in_sync"] if self.pool.up.get(s)]
            sources.sort(key=lambda s: s != move.source)
            if not sources:
                log.warning("cannot move %s: no in-sync replica is up", move.part)
                return False
            term = self.term()
            if part.bring_up_to_date(sources[0], term) != part.committed():
                log.warning("cannot move %s yet: shard %d has not applied every write",
                            move.part, sources[0])
                return False
            config, data = self.pool.client(sources[0]).export_collection(move.part)
            config["fence_term"] = term
            self.pool.client(move.target).import_collection(move.part, config, data)
            copy_model(self.pool, name, sources[0], move.target)

            def switch(e):
                if move.source not in e["replicas"] or move.target in e["replicas"]:
                    return None
                e["replicas"] = sorted([s for s in e["replicas"] if s != move.source]
                                       + [move.target])
                e["in_sync"] = sorted([s for s in e["in_sync"] if s != move.source]
                                      + [move.target])
                return e

            self.state.update_part(self.fence, move.part, switch)
        self.pool.up.setdefault(move.target, True)
        with contextlib.suppress(Exception):
            self.pool.client(move.source).drop_collection(move.part)
        log.warning("moved %s from shard %d to shard %d (%d bytes, %.2f s)", move.part,
                    move.source, move.target, len(data), time.monotonic() - t0)
        return True
